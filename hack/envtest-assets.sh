#!/usr/bin/env bash
# Provides the binaries controller-runtime's envtest needs (kube-apiserver,
# etcd) in the cache and prints the directory holding them, for
# KUBEBUILDER_ASSETS. kube-apiserver is built from the Go module proxy on the
# Kubernetes line KubeVirt v1.7.0 uses; etcd comes from install-deps.sh.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.33.5}
readonly ASSETS="${QCOW2_CACHE}/envtest/${KUBERNETES_VERSION}"

# k8s.io/kubernetes names its staging modules "=> ./staging/..." in its go.mod;
# outside its tree each must point at the published module of the same line.
write_apiserver_module() {
	local dir=$1 kube_gomod staging_version
	staging_version="v0${KUBERNETES_VERSION#v1}"
	kube_gomod=$(go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
	[[ -f ${kube_gomod} ]] || die "cannot download k8s.io/kubernetes@${KUBERNETES_VERSION}"
	mkdir -p "${dir}"
	{
		echo "module envtest-kube-apiserver"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
		echo
		sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"${staging_version}"'#p' "${kube_gomod}"
	} >"${dir}/go.mod"
	cat >"${dir}/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
}

build_kube_apiserver() {
	[[ -x ${ASSETS}/kube-apiserver ]] && return 0
	log "building kube-apiserver ${KUBERNETES_VERSION} (several minutes, once)"
	local src="${QCOW2_CACHE}/src/kube-apiserver-${KUBERNETES_VERSION}"
	write_apiserver_module "${src}"
	(
		cd "${src}"
		go mod tidy -e >/dev/null 2>&1 || true
		go mod download k8s.io/kubernetes
		local pkg=k8s.io/component-base/version
		CGO_ENABLED=0 go build -mod=mod -o "${ASSETS}/kube-apiserver.tmp" \
			-ldflags "-s -w -X ${pkg}.gitVersion=${KUBERNETES_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=33" \
			k8s.io/kubernetes/cmd/kube-apiserver
	)
	mv "${ASSETS}/kube-apiserver.tmp" "${ASSETS}/kube-apiserver"
}

link_etcd() {
	local etcd="${QCOW2_CACHE}/etcd/usr/bin/etcd"
	[[ -x ${etcd} ]] || die "etcd missing: run hack/install-deps.sh"
	ln -sf "${etcd}" "${ASSETS}/etcd"
}

main() {
	mkdir -p "${ASSETS}"
	build_kube_apiserver
	link_etcd
	echo "${ASSETS}"
}

main "$@"
