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

# stages.sh TARGET... [-- TARGET... [-- TARGET...]]: makes the targets
# before the first "--" in turn, then each "--"-separated chain of targets
# side by side, each chain in turn and stopping at its first failure, and
# prints how long each target took, so that a run against CI's time limit
# shows where the time went.
#
# Side by side is for chains that leave the CPU idle most of the time: the
# end-to-end runs wait on a cluster whose guests take one core. The first
# side-by-side chain prints as it goes; the others write to
# _out/stages/TARGET.log, whose end is printed when a target fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
readonly LOGS=_out/stages
mkdir -p "${LOGS}"
rm -f "${LOGS}"/*.log "${LOGS}"/*.times

# chain NAME TARGET...: makes the targets in turn, appending a line per
# target to $LOGS/NAME.times; fails at the first that fails. Chains other
# than 0 and 1 write each target's output to its log.
chain() {
	local name=$1 target t0 rc
	shift
	for target in "$@"; do
		t0=${SECONDS}
		echo "== stage ${target}"
		if [[ ${name} -lt 2 ]]; then
			make --no-print-directory "${target}"
		else
			make --no-print-directory "${target}" >"${LOGS}/${target}.log" 2>&1
		fi
		rc=$?
		printf '%6d s  %s%s\n' $((SECONDS - t0)) "${target}" "$([[ ${rc} -eq 0 ]] || echo "  FAILED")" >>"${LOGS}/${name}.times"
		[[ ${rc} -eq 0 ]] || return "${rc}"
	done
}

start=${SECONDS}
chains=() current=()
for arg in "$@"; do
	if [[ ${arg} == -- ]]; then
		chains+=("${current[*]}")
		current=()
	else
		current+=("${arg}")
	fi
done
chains+=("${current[*]}")

# shellcheck disable=SC2317 # called by the trap
report() {
	local target
	sed -n 's/^ *[0-9]* s  \([^ ]*\)  FAILED$/\1/p' "${LOGS}"/*.times 2>/dev/null |
		while read -r target; do
			[[ -f ${LOGS}/${target}.log ]] || continue
			echo "== the end of ${LOGS}/${target}.log"
			tail -n 150 "${LOGS}/${target}.log"
		done
	echo "== stage times"
	cat "${LOGS}"/*.times 2>/dev/null
	printf '%6d s  total\n' $((SECONDS - start))
}
trap report EXIT

# The first chain runs alone.
read -ra targets <<<"${chains[0]}"
chain 0 "${targets[@]}" || exit

pids=() rc=0
for ((i = 2; i < ${#chains[@]}; i++)); do
	read -ra targets <<<"${chains[i]}"
	echo "== beside: ${targets[*]} (logs in ${LOGS})"
	chain "${i}" "${targets[@]}" >/dev/null &
	pids+=($!)
done
if [[ ${#chains[@]} -gt 1 ]]; then
	read -ra targets <<<"${chains[1]}"
	chain 1 "${targets[@]}" || rc=$?
fi
for pid in "${pids[@]}"; do
	wait "${pid}" || rc=$?
done
exit "${rc}"
