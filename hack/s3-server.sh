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

# Provides the S3 server the backup suites and benchmark run on loopback:
# versitygw (posix backend, with conditional writes) built once from the Go
# module proxy into the cache. Prints the binary's path. Idempotent.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
readonly DEST="${QCOW2_CACHE}/versitygw/${VERSITYGW_VERSION}"

write_tools_module() {
	local dir=$1
	mkdir -p "${dir}"
	cat >"${dir}/go.mod" <<GOMOD
module s3-server-tools

go 1.24
GOMOD
	cat >"${dir}/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
GO
}

build_versitygw() {
	[[ -x ${DEST}/versitygw ]] && return 0
	log "building versitygw ${VERSITYGW_VERSION} (a few minutes, once)"
	local src="${QCOW2_CACHE}/src/versitygw-${VERSITYGW_VERSION}"
	write_tools_module "${src}"
	(
		cd "${src}"
		go get "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}" >/dev/null 2>&1
		go mod tidy >/dev/null 2>&1
		mkdir -p "${DEST}"
		CGO_ENABLED=0 go build -o "${DEST}/versitygw.tmp" github.com/versity/versitygw/cmd/versitygw
	)
	mv "${DEST}/versitygw.tmp" "${DEST}/versitygw"
}

main() {
	build_versitygw
	echo "${DEST}/versitygw"
}

main "$@"
