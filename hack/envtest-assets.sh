#!/usr/bin/env bash
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
