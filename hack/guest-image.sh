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

# Builds the Linux test guest, a bootable raw disk made only from Debian's
# packages: an MBR (syslinux's) and one ext4 partition holding extlinux,
# Debian's cloud kernel, a small initramfs that loads the virtio and SCSI
# modules the kernel lacks, and a root file system of busybox running the test
# program hack/guest/guest-test. The image is cached by the versions of
# the packages and the digest of the files here; the path of the image is
# printed.
#
#   hack/guest-image.sh        build (once) and print the image's path
#
# The guest prints its findings on the serial console (KubeVirt's
# guest-console-log container shows them): see hack/guest/guest-test.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly GUEST_DIR=${QCOW2_ROOT}/hack/guest
readonly PACKAGES=(linux-image-cloud-amd64 busybox-static extlinux syslinux-common)
# The modules virtio-blk (the root disk) and virtio-scsi (KubeVirt's
# hotplugged disks) need, in the order they load: Debian's cloud kernel has
# ext4 built in, but not these.
readonly MODULES=(
	drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko
	drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci_modern_dev.ko
	drivers/virtio/virtio_pci.ko drivers/block/virtio_blk.ko
	drivers/scsi/scsi_common.ko drivers/scsi/scsi_mod.ko drivers/scsi/sd_mod.ko
	drivers/scsi/virtio_scsi.ko
)
readonly IMAGE_MIB=128
readonly PARTITION_START_SECTOR=2048
# The golden content the guest checks on every boot, in MiB.
readonly GOLDEN_MIB=8

log() { printf 'guest-image.sh: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

candidate() { apt-cache policy "$1" | sed -n 's/^ *Candidate: //p'; }

# The kernel package the meta package names (linux-image-<abi>-cloud-amd64).
kernel_package() {
	apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1
}

ensure_apt_lists() {
	[[ -n $(candidate busybox-static) ]] || apt-get update -qq >/dev/null
	[[ -n $(candidate busybox-static) ]] || die "Debian's package lists name no busybox-static"
}

cache_key() {
	{
		local pkg
		for pkg in "${PACKAGES[@]}" "$(kernel_package)"; do echo "${pkg} $(candidate "${pkg}")"; done
		# Paths relative to the tree: the key must not depend on how the
		# script was called.
		(cd "${QCOW2_ROOT}" && find hack/guest hack/guest-image.sh -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -c1-16
}

# unpack WORK: the packages' files under WORK/pkg, without installing them.
unpack() {
	local work=$1 deb
	mkdir -p "${work}/debs" "${work}/pkg"
	(cd "${work}/debs" && apt-get download -qq "${PACKAGES[@]:1}" "$(kernel_package)" >/dev/null) ||
		die "cannot download ${PACKAGES[*]:1} $(kernel_package)"
	for deb in "${work}"/debs/*.deb; do dpkg-deb -x "${deb}" "${work}/pkg"; done
}

# initramfs WORK KVER: a newc archive that loads the modules, mounts
# the root partition and hands over to its /sbin/init.
initramfs() {
	local work=$1 kver=$2 dir=${1}/initramfs module
	mkdir -p "${dir}/bin" "${dir}/modules" "${dir}/dev" "${dir}/proc" "${dir}/sys" "${dir}/root"
	cp "${work}/pkg/bin/busybox" "${dir}/bin/busybox"
	ln -s busybox "${dir}/bin/sh"
	for module in "${MODULES[@]}"; do
		cp "${work}/pkg/lib/modules/${kver}/kernel/${module}" "${dir}/modules/"
		basename "${module}" >>"${dir}/modules/order"
	done
	cp "${GUEST_DIR}/initramfs-init" "${dir}/init"
	chmod 0755 "${dir}/init"
	(cd "${dir}" && find . | "${work}/pkg/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -9) >"${work}/initrd.img"
}

# rootfs WORK: the root file system's tree, golden content included.
rootfs() {
	local work=$1 dir=${1}/rootfs applet
	mkdir -p "${dir}"/{bin,sbin,etc/guest,proc,sys,dev,tmp,var/guest,boot/extlinux}
	cp "${work}/pkg/bin/busybox" "${dir}/bin/busybox"
	for applet in $("${work}/pkg/bin/busybox" --list); do
		[[ ${applet} == busybox ]] || ln -sf busybox "${dir}/bin/${applet}"
	done
	install -m 0755 "${GUEST_DIR}/guest-test" "${dir}/sbin/init"
	# Golden content: numbered lines, so every build holds the same bytes.
	seq -f 'kubevirt-qcow2 golden image, line %09g' 1 $(((GOLDEN_MIB << 20) / 40)) >"${dir}/etc/guest/golden"
	truncate -s "${GOLDEN_MIB}M" "${dir}/etc/guest/golden"
	(cd "${dir}/etc/guest" && sha256sum golden >golden.sha256)
}

# disk WORK IMAGE KERNEL: the bootable raw disk.
disk() {
	local work=$1 image=$2 kernel=$3 root=${1}/rootfs mnt=${1}/mnt loop
	cp "${kernel}" "${root}/boot/vmlinuz"
	cp "${work}/initrd.img" "${root}/boot/initrd.img"
	cp "${GUEST_DIR}/extlinux.conf" "${root}/boot/extlinux/extlinux.conf"
	truncate -s "${IMAGE_MIB}M" "${image}"
	local sectors=$(((IMAGE_MIB << 11) - PARTITION_START_SECTOR))
	# extlinux 6.04 reads ext4 without the 64bit feature. Inode tables and
	# journal zeroed now: the guest writes only what its program writes,
	# not a background initialisation.
	mkfs.ext4 -q -F -L guestroot -b 4096 -O ^64bit \
		-E offset=$((PARTITION_START_SECTOR * 512)),lazy_itable_init=0,lazy_journal_init=0 -d "${root}" \
		"${image}" "$((sectors / 2))k"
	# The MBR: syslinux's boot code, and one active Linux partition.
	dd if="${work}/pkg/usr/lib/syslinux/mbr/mbr.bin" of="${image}" conv=notrunc status=none
	mbr_partition "${PARTITION_START_SECTOR}" "${sectors}" | dd of="${image}" bs=1 seek=446 conv=notrunc status=none
	mkdir -p "${mnt}"
	loop=$(losetup --find --show --offset $((PARTITION_START_SECTOR * 512)) "${image}")
	mount "${loop}" "${mnt}" || {
		losetup -d "${loop}"
		die "cannot mount the guest's root partition"
	}
	"${work}/pkg/usr/bin/extlinux" --install "${mnt}/boot/extlinux" >/dev/null 2>&1 || {
		umount "${mnt}"
		losetup -d "${loop}"
		die "extlinux could not install its boot loader"
	}
	umount "${mnt}"
	losetup -d "${loop}"
}

# mbr_partition START SECTORS: the 16-byte entry of a bootable Linux
# partition (LBA only, CHS saying so) followed by the MBR signature.
mbr_partition() {
	local start=$1 sectors=$2
	le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
	# shellcheck disable=SC2059 # the format is built of escapes
	printf "\\x80\\xfe\\xff\\xff\\x83\\xfe\\xff\\xff$(le32 "${start}")$(le32 "${sectors}")"
	head -c 48 /dev/zero
	printf '\x55\xaa'
}

main() {
	[[ $(id -u) == 0 ]] || die "building the guest mounts its file system: run as root"
	ensure_apt_lists
	local dir image
	dir="${QCOW2_CACHE}/guest/linux-$(cache_key)"
	image="${dir}/guest.raw"
	if [[ ! -f ${image} ]]; then
		log "building the Linux test guest into ${dir}"
		local work
		work=$(mktemp -d)
		# shellcheck disable=SC2064 # expand now: work is local
		trap "rm -rf '${work}'" EXIT
		unpack "${work}"
		local kernel kver
		kernel=$(find "${work}/pkg/boot" -name 'vmlinuz-*' | head -n1)
		[[ -n ${kernel} ]] || die "no kernel in $(kernel_package)"
		kver=${kernel##*/vmlinuz-}
		initramfs "${work}" "${kver}"
		rootfs "${work}"
		disk "${work}" "${work}/guest.raw" "${kernel}"
		mkdir -p "${dir}"
		echo "${kver}" >"${dir}/kernel-version"
		mv "${work}/guest.raw" "${image}.new"
		mv "${image}.new" "${image}"
		# Guests of other package versions or programs are not used again.
		find "${QCOW2_CACHE}/guest" -mindepth 1 -maxdepth 1 -name 'linux-*' ! -path "${dir}" -exec rm -rf {} +
	fi
	echo "${image}"
}

main "$@"
