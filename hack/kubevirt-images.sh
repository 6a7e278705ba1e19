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

# Builds every image virt-operator v1.7.0 deploys with the cluster's default
# feature gates (virt-operator, virt-api, virt-controller, virt-handler,
# virt-launcher) from a KubeVirt tree's binaries, without a container engine
# or a registry, and the release manifests that name them:
#
#   hack/kubevirt-images.sh         the patched tree's (make images):
#     _out/images/<component>/        OCI image layouts
#     _out/images/<component>.tar     docker archives, for `hack/cluster.sh import`
#     _out/kubevirt-v1.7.0/manifests/kubevirt-operator.yaml
#   hack/kubevirt-images.sh stock   stock KubeVirt from the tree's `pristine`
#                                   tag (make images-stock), named as
#                                   upstream's release names them, cached once
#                                   per version and inputs; prints the directory:
#     $QCOW2_CACHE/kubevirt-stock-v1.7.0/{tree,bin,images,manifests}
#
# virt-handler and virt-launcher share one base made from Debian 13's
# packages (libvirt 11.3, QEMU 10.0), unpacked without maintainer scripts and
# cached by the exact package versions; the other three hold their binary on
# Debian 13's C library. docs/install.md lists what differs from upstream's
# images.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source-path=SCRIPTDIR source=debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"

# What is built from which tree, and where it goes: set by main for the
# patched or the stock images.
IMAGE_REGISTRY=${IMAGE_REGISTRY:-kubevirt-qcow2}
IMAGE_TAG=${IMAGE_TAG:-dev}
TREE=${KUBEVIRT_TREE}
OUT=${KUBEVIRT_OUT}
IMAGES=${QCOW2_ROOT}/_out/images
CONTAINER_DISK=${QCOW2_ROOT}/_out/bin/container-disk
# Stock images: under upstream's names, so that virt-operator derives the
# same names its release does; imported, never pulled.
readonly STOCK=${QCOW2_CACHE}/kubevirt-stock-${KUBEVIRT_VERSION}
readonly STOCK_REGISTRY=quay.io/kubevirt
# The binaries the images hold.
readonly BINARIES=(virt-operator virt-api virt-controller virt-handler virt-chroot virt-launcher
	virt-launcher-monitor virt-probe virt-tail virt-freezer)
# What virt-handler, virt-launcher and the programs they start run: libvirt's
# daemons and virsh, QEMU, qemu-img, and a shell with the usual tools for
# node-labeller.sh and KubeVirt's exec probes; libnbd for v1.8's
# virt-launcher (changed block tracking).
readonly NODE_SUITE=trixie
readonly BASE_PACKAGES=(
	base-files bash dash coreutils util-linux mount grep sed findutils procps
	libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils
	nftables iproute2 libnbd0
)
# Upstream's users: root, and qemu (107) that the non-root launcher runs as;
# nonroot (1001) for the Go components. Debian's libvirt resolves its
# compiled-in default user libvirt-qemu before it reads qemu.conf.
readonly PASSWD='root:x:0:0:root:/root:/bin/bash
qemu:x:107:107:qemu:/home/qemu:/bin/bash
nonroot:x:1001:1001:nonroot:/home/nonroot:/sbin/nologin
libvirt-qemu:x:64055:64055:libvirt qemu:/nonexistent:/usr/sbin/nologin'
readonly GROUP='root:x:0:
qemu:x:107:
nonroot:x:1001:
libvirt-qemu:x:64055:'

# The node base's users and directories, which maintainer scripts would
# have made.
finish_node_base() {
	local root=$1
	printf '%s\n' "${PASSWD}" >"${root}/etc/passwd"
	printf '%s\n' "${GROUP}" >"${root}/etc/group"
	mkdir -p "${root}/home/qemu" "${root}/var/log/libvirt"
	# KubeVirt names both /run and /var/run for the same files.
	rm -rf "${root}/var/run" "${root}/var/lock"
	ln -s ../run "${root}/var/run"
	ln -s ../run/lock "${root}/var/lock"
	# Documentation and translations are not needed to run.
	rm -rf "${root}/usr/share/doc" "${root}/usr/share/man" "${root}/usr/share/locale" "${root}/usr/share/info"
}

# The base's root file system; prints its directory. debian_root keys it by
# finish_node_base's text, not by the users it writes: they go into its name.
node_base() {
	debian_root "node-base-$(users_key)" "${NODE_SUITE}" finish_node_base "${BASE_PACKAGES[@]}"
}

users_key() { printf '%s\n' "${PASSWD}" "${GROUP}" | sha256sum | cut -c1-8; }

# The Go components' base: the users and Debian 13's C library, the one the
# build root links against (a binary built on this Debian 12 machine runs
# on it too), and a /tmp (virt-api writes its certificates there).
finish_go_base() {
	local root=$1
	printf '%s\n' "${PASSWD}" >"${root}/etc/passwd"
	printf '%s\n' "${GROUP}" >"${root}/etc/group"
	rm -rf "${root:?}/usr/share"
}

go_base() {
	debian_root "go-base-$(users_key)" "${NODE_SUITE}" finish_go_base libc6
}

image() {
	local name=$1
	shift
	"${OUT}/tools/oci-image" --out "${IMAGES}/${name}" --archive "${IMAGES}/${name}.tar" \
		--ref "${IMAGE_REGISTRY}/${name}:${IMAGE_TAG}" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		"$@" | sed -n 1p
}

kubevirt_images() {
	local base tree=${TREE} bin=${OUT}/bin conf
	for b in "${BINARIES[@]}"; do
		[[ -x ${bin}/${b} ]] || die "no ${bin}/${b}: run make kubevirt"
	done
	[[ -x ${CONTAINER_DISK} ]] || die "no ${CONTAINER_DISK}: run make build"
	(cd "${QCOW2_ROOT}" && go build -o "${OUT}/tools/oci-image" ./cmd/oci-image)
	base=$(node_base)
	mkdir -p "${IMAGES}"
	local c go
	go=$(go_base)
	for c in virt-operator virt-api virt-controller; do
		image "${c}" --tree "${go}" --file "${bin}/${c}:/usr/bin/${c}:0555" --user 1001
	done
	image virt-handler --tree "${base}" \
		--file "${bin}/virt-handler:/usr/bin/virt-handler:0555" \
		--file "${bin}/virt-chroot:/usr/bin/virt-chroot:0555" \
		--entrypoint /usr/bin/virt-handler
	conf=$(mktemp -d)
	# Debian's libvirt has only the monolithic daemon; virt-launcher and
	# node-labeller.sh start virtqemud and connect to its socket name.
	cat >"${conf}/virtqemud" <<'SH'
#!/bin/sh
# libvirtd under the modular daemon's name (Debian has no virtqemud).
dir=/run/libvirt
[ "$(id -u)" = 0 ] || dir=${XDG_RUNTIME_DIR:-/run}/libvirt
mkdir -p "$dir"
ln -sf libvirt-sock "$dir/virtqemud-sock"
exec /usr/sbin/libvirtd "$@"
SH
	echo '# defaults' >"${conf}/virtlogd.conf"
	image virt-launcher --tree "${base}" \
		--file "${bin}/virt-launcher:/usr/bin/virt-launcher:0555" \
		--file "${bin}/virt-launcher-monitor:/usr/bin/virt-launcher-monitor:0555" \
		--file "${bin}/virt-probe:/usr/bin/virt-probe:0555" \
		--file "${bin}/virt-tail:/usr/bin/virt-tail:0555" \
		--file "${bin}/virt-freezer:/usr/bin/virt-freezer:0555" \
		--file "${CONTAINER_DISK}:/usr/bin/container-disk:0555" \
		--file "${tree}/cmd/virt-launcher/node-labeller/node-labeller.sh:/usr/bin/node-labeller.sh:0555" \
		--file "${tree}/cmd/virt-launcher/qemu.conf:/etc/libvirt/qemu.conf:0644" \
		--file "${tree}/cmd/virt-launcher/virtqemud.conf:/etc/libvirt/virtqemud.conf:0644" \
		--file "${conf}/virtlogd.conf:/etc/libvirt/virtlogd.conf:0644" \
		--file "${tree}/cmd/virt-launcher/qemu:/etc/libvirt/hooks/qemu:0755" \
		--file "${tree}/cmd/virt-launcher/nsswitch.conf:/etc/nsswitch.conf:0644" \
		--file "${conf}/virtqemud:/usr/sbin/virtqemud:0755" \
		--cap /usr/bin/virt-launcher-monitor=cap_net_bind_service \
		--entrypoint /usr/bin/virt-launcher
	rm -rf "${conf}"
}

# The operator manifest as KubeVirt's release renders it: its templates,
# filled by its own manifest-templator, naming our images.
# The release manifests as KubeVirt's release renders them: its templates,
# filled by its own manifest-templator, naming our images. The KubeVirt CR
# (kubevirt-cr.yaml, no feature gates) is what a stock install applies.
operator_manifest() {
	local tree=${TREE} out="${OUT}/manifests" templator name
	templator="${OUT}/tools/manifest-templator"
	tree_go "${tree}" . build -o "${templator}" ./tools/manifest-templator
	mkdir -p "${out}"
	for name in kubevirt-operator kubevirt-cr; do
		"${templator}" --process-files --generated-manifests-dir="${tree}/manifests/generated/" \
			--input-file="${tree}/manifests/release/${name}.yaml.in" >"${out}/${name}.yaml.in"
		"${templator}" --process-vars --input-file="${out}/${name}.yaml.in" \
			--namespace=kubevirt --container-prefix="${IMAGE_REGISTRY}" --container-tag="${IMAGE_TAG}" \
			--image-pull-policy=IfNotPresent --verbosity=2 --kubevirt-logo-path="${tree}/assets/kubevirt_logo.png" \
			>"${out}/${name}.yaml"
		rm "${out}/${name}.yaml.in"
	done
	echo "${out}/kubevirt-operator.yaml"
}

# Stock KubeVirt: the pristine tree exported once, its binaries and its own
# container-disk built, then the same images and manifests as the patched
# ones. Done again only when the pristine commit, this script or the node
# base change.
stock() {
	"${QCOW2_ROOT}/hack/kubevirt.sh" assemble
	local commit key
	commit=$(git -C "${KUBEVIRT_TREE}" rev-parse pristine)
	key=$( (echo "${commit}" && basename "$(node_base)" && basename "$(go_base)" && cat "${BASH_SOURCE[0]}") | sha256sum | cut -c1-16)
	if [[ -f ${STOCK}/key && $(<"${STOCK}/key") == "${key}" ]]; then
		echo "${STOCK}"
		return 0
	fi
	log "building stock KubeVirt ${KUBEVIRT_VERSION} (${commit:0:12}) into ${STOCK} (once per version)"
	rm -f "${STOCK}/key"
	if [[ ! -f ${STOCK}/tree/.commit || $(<"${STOCK}/tree/.commit") != "${commit}" ]]; then
		rm -rf "${STOCK}/tree"
		mkdir -p "${STOCK}/tree"
		git -C "${KUBEVIRT_TREE}" archive pristine | tar -x -C "${STOCK}/tree"
		echo "${commit}" >"${STOCK}/tree/.commit"
	fi
	TREE=${STOCK}/tree OUT=${STOCK} IMAGES=${STOCK}/images CONTAINER_DISK=${STOCK}/bin/container-disk
	IMAGE_REGISTRY=${STOCK_REGISTRY} IMAGE_TAG=${KUBEVIRT_VERSION}
	mkdir -p "${STOCK}/bin"
	local b
	for b in "${BINARIES[@]}"; do
		tree_go "${TREE}" . build -trimpath -o "${STOCK}/bin/${b}" "./cmd/${b}"
	done
	# Upstream's container-disk, static as upstream links it.
	"${MUSL_CC:-musl-gcc}" -Os -static -s -o "${CONTAINER_DISK}" "${TREE}/cmd/container-disk-v2alpha/main.c"
	kubevirt_images
	operator_manifest >/dev/null
	echo "${key}" >"${STOCK}/key"
	echo "${STOCK}"
}

main() {
	case "${1:-}" in
	"")
		kubevirt_images
		operator_manifest
		;;
	stock) stock ;;
	*) die "usage: $0 [stock]" ;;
	esac
}

main "$@"
