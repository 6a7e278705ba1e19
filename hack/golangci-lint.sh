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

# Builds golangci-lint from the Go module proxy at a pinned version, once,
# into the cache outside the work tree, and prints the binary's path. The
# configuration is .golangci.yml at the top of the tree.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly GOLANGCI_LINT_VERSION=${GOLANGCI_LINT_VERSION:-v2.15.0}
readonly BIN_DIR="${QCOW2_CACHE}/golangci-lint/${GOLANGCI_LINT_VERSION}"

main() {
	local bin="${BIN_DIR}/golangci-lint"
	if [[ ! -x ${bin} ]]; then
		log "building golangci-lint ${GOLANGCI_LINT_VERSION} (a few minutes, once)"
		mkdir -p "${BIN_DIR}"
		# GOBIN is set so that go install writes nowhere but the cache; a
		# failed build leaves no binary behind.
		rm -rf "${BIN_DIR}/.build"
		GOBIN="${BIN_DIR}/.build" CGO_ENABLED=0 go install -trimpath \
			"github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${GOLANGCI_LINT_VERSION}"
		mv "${BIN_DIR}/.build/golangci-lint" "${bin}"
		rm -rf "${BIN_DIR}/.build"
	fi
	echo "${bin}"
}

main "$@"
