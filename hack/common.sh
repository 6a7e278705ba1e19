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
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.8.3}
KUBEVIRT_TREE=${KUBEVIRT_TREE:-${QCOW2_ROOT}/_build/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_PATCHES=${KUBEVIRT_PATCHES:-${QCOW2_ROOT}/patches/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_OUT=${KUBEVIRT_OUT:-${QCOW2_ROOT}/_out/kubevirt-${KUBEVIRT_VERSION}}

case ${KUBEVIRT_VERSION} in
v1.8.3)
	# The checksum database does not know these modules; the module proxy
	# serves them. Bypassed for exactly these three.
	export GONOSUMDB=${GONOSUMDB:+${GONOSUMDB},}kubevirt.io/virt-template-api,kubevirt.io/virt-template-client-go,kubevirt.io/virt-template-engine
	# virt-launcher's NBD client links libnbd >= 1.22, which Debian 12
	# lacks, through Go bindings at a version the module proxy refuses: Go
	# commands in the tree run in the Debian 13 build root, with the
	# bindings of its libnbd (hack/buildroot.sh).
	KUBEVIRT_BUILD_ROOT=1
	;;
*) KUBEVIRT_BUILD_ROOT= ;;
esac

# kubevirt_go ARGS...: the go command for a KubeVirt tree of
# KUBEVIRT_VERSION, in the current directory: in the build root where the
# version needs one.
kubevirt_go() {
	if [[ -n ${KUBEVIRT_BUILD_ROOT} ]]; then
		"${QCOW2_ROOT}/hack/buildroot.sh" go "$@"
	else
		go "$@"
	fi
}

# kubevirt_gowork TREE prints the workspace file Go commands in TREE (the
# patched tree or its pristine worktree) run with, for GOWORK: where the
# version needs the build root, the tree's own go.work with its paths made
# absolute and libnbd replaced by the build root's bindings, written beside
# the tree (TREE.gowork/), never into it. Prints nothing otherwise: the
# tree's go.work applies.
kubevirt_gowork() {
	local tree=$1
	[[ -n ${KUBEVIRT_BUILD_ROOT} && -f ${tree}/go.work ]] || return 0
	local dir="${tree}.gowork" bindings
	bindings=$("${QCOW2_ROOT}/hack/buildroot.sh" libnbd-go)
	mkdir -p "${dir}"
	{
		sed -e "s#^\t\.\(/.*\)\?\$#\t${tree}\1#" "${tree}/go.work"
		printf '\nreplace libguestfs.org/libnbd => %s\n' "${bindings}"
	} >"${dir}/go.work.new"
	mv "${dir}/go.work.new" "${dir}/go.work"
	[[ -f ${dir}/go.work.sum || ! -f ${tree}/go.work.sum ]] || cp "${tree}/go.work.sum" "${dir}/go.work.sum"
	echo "${dir}/go.work"
}

# tree_go TREE DIR ARGS...: the go command in TREE/DIR with the workspace and
# the build root the version needs (kubevirt_gowork, kubevirt_go). Both are
# worked out once per run, not per command: apt takes seconds to resolve
# the build root's packages, and a test run calls go once per package.
declare -A GOWORKS=()
tree_go() {
	local tree=$1 dir=$2
	shift 2
	if [[ -n ${KUBEVIRT_BUILD_ROOT} && -z ${BUILD_ROOT:-} ]]; then
		BUILD_ROOT=$("${QCOW2_ROOT}/hack/buildroot.sh" path)
		export BUILD_ROOT
	fi
	[[ -v GOWORKS[${tree}] ]] || GOWORKS[${tree}]=$(kubevirt_gowork "${tree}")
	(cd "${tree}/${dir}" && GOWORK=${GOWORKS[${tree}]} kubevirt_go "$@")
}

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }
