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

# Builds Kubernetes binaries from the Go module proxy on the line KubeVirt
# v1.7.0 uses, caches them by version outside the work tree and prints the
# directory holding them. With no arguments it builds what a one-node cluster
# needs; with names (kube-apiserver, kubelet, ...) only those. Missing
# binaries are built together by one `go build` in one module.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.33.5}
readonly BIN_DIR="${QCOW2_CACHE}/kubernetes/${KUBERNETES_VERSION}"
readonly ALL_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

# k8s.io/kubernetes names its staging modules "=> ./staging/..." in its go.mod;
# outside its tree each must point at the published module of the same line.
write_module() {
	local dir=$1 kube_gomod staging_version cmd
	staging_version="v0${KUBERNETES_VERSION#v1}"
	kube_gomod=$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[[ -f ${kube_gomod} ]] || die "cannot download k8s.io/kubernetes@${KUBERNETES_VERSION}"
	mkdir -p "${dir}"
	{
		echo "module kubevirt-qcow2-kubernetes"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
		echo
		sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"${staging_version}"'#p' "${kube_gomod}"
	} >"${dir}/go.mod"
	{
		printf '//go:build tools\n\npackage tools\n\nimport (\n'
		for cmd in "${ALL_COMMANDS[@]}"; do
			printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${cmd}"
		done
		printf ')\n'
	} >"${dir}/tools.go"
}

build() {
	local missing=() cmd pkgs=()
	for cmd in "$@"; do
		[[ -x ${BIN_DIR}/${cmd} ]] || missing+=("${cmd}")
	done
	[[ ${#missing[@]} -eq 0 ]] && return 0
	log "building ${missing[*]} ${KUBERNETES_VERSION} (kubelet: half an hour on 2 cores, once)"
	local src="${QCOW2_CACHE}/src/kubernetes-${KUBERNETES_VERSION}" out="${BIN_DIR}/.build"
	write_module "${src}"
	for cmd in "${missing[@]}"; do
		pkgs+=("k8s.io/kubernetes/cmd/${cmd}")
	done
	rm -rf "${out}"
	mkdir -p "${out}"
	(
		cd "${src}"
		go mod tidy -e >/dev/null 2>&1 || true
		go mod download k8s.io/kubernetes
		local v=k8s.io/component-base/version minor
		minor=${KUBERNETES_VERSION#v1.}
		minor=${minor%%.*}
		CGO_ENABLED=0 go build -mod=mod -trimpath -o "${out}/" \
			-ldflags "-s -w -X ${v}.gitVersion=${KUBERNETES_VERSION} -X ${v}.gitMajor=1 -X ${v}.gitMinor=${minor}" \
			"${pkgs[@]}"
	)
	for cmd in "${missing[@]}"; do
		mv "${out}/${cmd}" "${BIN_DIR}/${cmd}"
	done
	rm -rf "${out}"
}

main() {
	local cmds=("$@")
	[[ ${#cmds[@]} -gt 0 ]] || cmds=("${ALL_COMMANDS[@]}")
	mkdir -p "${BIN_DIR}"
	build "${cmds[@]}"
	echo "${BIN_DIR}"
}

main "$@"
