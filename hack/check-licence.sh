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

# Fails naming every tracked Go, C and shell source file of ours that lacks
# the licence header (the form is in any of them, e.g. this one). Not ours:
# patches/ (KubeVirt's) and testdata/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
missing=$(git ls-files -z '*.go' '*.c' '*.h' '*.sh' .ci/run ':!:patches/' ':!:**/testdata/**' |
	xargs -0 grep -L -- 'This file is part of the kubevirt-qcow2 project' || true)
if [[ -n "$missing" ]]; then
	printf '%s\n' "$missing"
	echo "check-licence: files above lack the licence header (see hack/check-licence.sh)" >&2
	exit 1
fi
