#!/usr/bin/env bash
#
# This file is part of the kubevirt-qcow2 project
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Copyright The kubevirt-qcow2 Authors.
#

# Builds Velero and its AWS object store plugin from the Go module proxy at
# pinned versions, once, into the cache outside the work tree, and prints
# the directory holding them:
#
#   velero                  server, node-agent and CLI (one binary), with
#   velero-helper,          the two helpers Velero's own image carries
#   velero-restore-helper
#   velero-plugin-for-aws   the object store plugin of `provider: aws`
#   cp-plugin               its image's entrypoint, which copies it into
#                           Velero's plugins directory
#
# Velero is the release the module pins (go.mod), so the server runs the
# code the datamover's suites test against. Velero's compatibility matrix
# pairs Velero v1.17 with the AWS plugin v1.13, which the module proxy does
# not serve (403, "This module version is not available"); v1.14.3, the
# plugin built for Velero v1.18, is the one it serves. The object store
# plugin protocol is the same in both (tests/e2e runs them together).
# Both modules are built inside themselves, with their own go.mod and
# go.sum (Velero's carries a replace directive, which `go install
# mod@version` refuses), static and with Velero's version recorded as its
# release build records it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VELERO_VERSION=${VELERO_VERSION:-$(cd "${QCOW2_ROOT}" && go list -m -f '{{.Version}}' github.com/vmware-tanzu/velero)}
readonly VELERO_VERSION
readonly VELERO_AWS_PLUGIN_VERSION=${VELERO_AWS_PLUGIN_VERSION:-v1.14.3}
readonly BIN_DIR="${QCOW2_CACHE}/velero/velero-${VELERO_VERSION}-aws-${VELERO_AWS_PLUGIN_VERSION}"

# module_dir MODULE VERSION: the module's directory in the module cache.
module_dir() {
	local dir
	dir=$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d ${dir} ]] || die "cannot download $1@$2"
	echo "${dir}"
}

# build DIR LDFLAGS NAME=PACKAGE...: each package of the module in DIR into
# BIN_DIR under NAME.
build() {
	local dir=$1 ldflags=$2 spec name pkg
	shift 2
	for spec in "$@"; do
		name=${spec%%=*} pkg=${spec#*=}
		[[ -x ${BIN_DIR}/${name} ]] && continue
		local start=${SECONDS}
		log "building ${name} (minutes on 2 cores, once)"
		rm -rf "${BIN_DIR}/.build"
		mkdir -p "${BIN_DIR}/.build"
		# The module cache is read-only and the module's go.sum complete:
		# nothing is written there, only the binary under the cache.
		(
			cd "${dir}"
			CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w ${ldflags}" \
				-o "${BIN_DIR}/.build/${name}" "${pkg}"
		)
		mv "${BIN_DIR}/.build/${name}" "${BIN_DIR}/${name}"
		log "built ${name} in $((SECONDS - start))s"
	done
	rm -rf "${BIN_DIR}/.build"
}

main() {
	local velero aws info
	velero=$(module_dir github.com/vmware-tanzu/velero "${VELERO_VERSION}")
	aws=$(module_dir github.com/vmware-tanzu/velero-plugin-for-aws "${VELERO_AWS_PLUGIN_VERSION}")
	info="-X github.com/vmware-tanzu/velero/pkg/buildinfo.Version=${VELERO_VERSION}"
	info+=" -X github.com/vmware-tanzu/velero/pkg/buildinfo.GitTreeState=clean"
	build "${velero}" "${info}" velero=./cmd/velero velero-helper=./cmd/velero-helper \
		velero-restore-helper=./cmd/velero-restore-helper
	build "${aws}" "" velero-plugin-for-aws=./velero-plugin-for-aws cp-plugin=./hack/cp-plugin
	echo "${BIN_DIR}"
}

main "$@"
