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

# Builds the Kubernetes CSI sidecars that pair with csi-loop, the
# external-provisioner and the external-resizer, from the Go module proxy at
# pinned versions, once each, into the cache outside the work tree, and
# prints the directory holding csi-provisioner and csi-resizer. Both modules
# carry replace directives, which `go install mod@version` refuses: each is
# built inside its own module, as its release tooling does (static,
# main.version set).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly CSI_PROVISIONER_VERSION=${CSI_PROVISIONER_VERSION:-v5.3.0}
readonly CSI_RESIZER_VERSION=${CSI_RESIZER_VERSION:-v1.14.0}
readonly BIN_DIR="${QCOW2_CACHE}/csi-sidecars/provisioner-${CSI_PROVISIONER_VERSION}-resizer-${CSI_RESIZER_VERSION}"

# build NAME MODULE VERSION: cmd/NAME of MODULE@VERSION into BIN_DIR.
build() {
	local name=$1 module=$2 version=$3 dir start=${SECONDS}
	[[ -x ${BIN_DIR}/${name} ]] && return 0
	log "building ${name} ${version} (minutes on 2 cores, once)"
	dir=$(go mod download -json "${module}@${version}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d ${dir} ]] || die "cannot download ${module}@${version}"
	mkdir -p "${BIN_DIR}"
	rm -rf "${BIN_DIR}/.build"
	# The module cache is read-only, and the module's go.sum is complete:
	# nothing is written there, only the binary under the cache.
	(
		cd "${dir}"
		CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
			-ldflags "-s -w -X main.version=${version}" -o "${BIN_DIR}/.build/${name}" "./cmd/${name}"
	)
	mv "${BIN_DIR}/.build/${name}" "${BIN_DIR}/${name}"
	rm -rf "${BIN_DIR}/.build"
	log "built ${name} ${version} in $((SECONDS - start))s"
}

main() {
	build csi-provisioner github.com/kubernetes-csi/external-provisioner/v5 "${CSI_PROVISIONER_VERSION}"
	build csi-resizer github.com/kubernetes-csi/external-resizer "${CSI_RESIZER_VERSION}"
	echo "${BIN_DIR}"
}

main "$@"
