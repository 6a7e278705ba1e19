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

# Provides the binaries controller-runtime's envtest needs (kube-apiserver,
# etcd) in the cache and prints the directory holding them, for
# KUBEBUILDER_ASSETS. kube-apiserver comes from hack/kubernetes.sh (the
# Kubernetes line KubeVirt v1.7.0 uses), etcd from install-deps.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.33.5}
readonly ASSETS="${QCOW2_CACHE}/envtest/${KUBERNETES_VERSION}"

main() {
	local kube etcd="${QCOW2_CACHE}/etcd/usr/bin/etcd"
	[[ -x ${etcd} ]] || die "etcd missing: run hack/install-deps.sh"
	kube=$("${QCOW2_ROOT}/hack/kubernetes.sh" kube-apiserver)
	mkdir -p "${ASSETS}"
	ln -sf "${kube}/kube-apiserver" "${ASSETS}/kube-apiserver"
	ln -sf "${etcd}" "${ASSETS}/etcd"
	echo "${ASSETS}"
}

main "$@"
