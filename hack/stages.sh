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

# stages.sh TARGET...: makes each target in turn, stopping at the first
# that fails, and prints how long each took, so that a run against CI's
# time limit shows where the time went.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
times=()
report() {
	echo "== stage times"
	printf '%s\n' "${times[@]}"
}
trap report EXIT
start=${SECONDS}
for target in "$@"; do
	t0=${SECONDS}
	echo "== stage ${target}"
	make --no-print-directory "${target}"
	rc=$?
	times+=("$(printf '%6d s  %s' $((SECONDS - t0)) "${target}")$([[ ${rc} -eq 0 ]] || echo "  FAILED")")
	[[ ${rc} -eq 0 ]] || exit "${rc}"
done
times+=("$(printf '%6d s  total' $((SECONDS - start)))")
