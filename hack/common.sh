# shellcheck shell=bash
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

# Shared settings for the hack/ scripts. Sourced, not run.

QCOW2_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Built tools (kube-apiserver, etcd, generators) outlive a work tree.
QCOW2_CACHE=${QCOW2_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/kubevirt-qcow2}
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.7.0}
KUBEVIRT_TREE=${KUBEVIRT_TREE:-${QCOW2_ROOT}/_build/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_PATCHES=${KUBEVIRT_PATCHES:-${QCOW2_ROOT}/patches/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_OUT=${KUBEVIRT_OUT:-${QCOW2_ROOT}/_out/kubevirt-${KUBEVIRT_VERSION}}

case ${KUBEVIRT_VERSION} in
v1.8.3)
	# The checksum database does not know these modules; the module proxy
	# serves them. Bypassed for exactly these three.
	export GONOSUMDB=${GONOSUMDB:+${GONOSUMDB},}kubevirt.io/virt-template-api,kubevirt.io/virt-template-client-go,kubevirt.io/virt-template-engine
	# KubeVirt v1.8.3 requires libguestfs.org/libnbd at a version the module
	# proxy refuses, and virt-launcher's NBD client needs libnbd >= 1.22's
	# 64-bit block status API, which Debian 12 (libnbd 1.14) lacks. An API
	# stub stands in for it (hack/stubs/libnbd: what that client calls,
	# every call failing), so that the module graph loads and the packages
	# that import the client compile and run their tests. virt-launcher,
	# the one binary that links it, is never built (hack/kubevirt.sh), so
	# nothing built with the stub goes into an image.
	KUBEVIRT_MODULE_STUBS=(libguestfs.org/libnbd)
	;;
*) KUBEVIRT_MODULE_STUBS=() ;;
esac

# kubevirt_gowork TREE prints the workspace file Go commands in TREE (the
# patched tree or its pristine worktree) run with, for GOWORK: the tree's
# own go.work with its paths made absolute, plus a replace of each of
# KUBEVIRT_MODULE_STUBS by hack/stubs/<last path element>, written beside
# the tree (TREE.gowork/), never into it. Prints nothing when the version
# needs no stub: the tree's go.work applies.
kubevirt_gowork() {
	local tree=$1
	[[ ${#KUBEVIRT_MODULE_STUBS[@]} -gt 0 && -f ${tree}/go.work ]] || return 0
	local dir="${tree}.gowork" module
	mkdir -p "${dir}"
	{
		sed -e "s#^\t\.\(/.*\)\?\$#\t${tree}\1#" "${tree}/go.work"
		for module in "${KUBEVIRT_MODULE_STUBS[@]}"; do
			printf '\nreplace %s => %s\n' "${module}" "${QCOW2_ROOT}/hack/stubs/${module##*/}"
		done
	} >"${dir}/go.work.new"
	mv "${dir}/go.work.new" "${dir}/go.work"
	[[ -f ${dir}/go.work.sum || ! -f ${tree}/go.work.sum ]] || cp "${tree}/go.work.sum" "${dir}/go.work.sum"
	echo "${dir}/go.work"
}

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }
