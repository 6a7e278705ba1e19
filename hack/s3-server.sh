#!/usr/bin/env bash
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
