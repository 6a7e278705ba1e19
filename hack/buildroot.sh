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

# The build root: Debian 13's C compiler and the C libraries KubeVirt v1.8's
# binaries link (libvirt 11.3, libnbd 1.22), the versions the node images
# carry. A binary linked on this Debian 12 machine would need its glibc and
# its libvirt, and Debian 12's libnbd 1.14 lacks the 64-bit block status API
# KubeVirt's NBD client calls.
#
#   hack/buildroot.sh path          make the root (once per package set) and
#                                   print its directory
#   hack/buildroot.sh go ARGS...    the go command, in the current directory,
#                                   inside the root (BUILD_ROOT, when set, is
#                                   the root `path` printed, not resolved again)
#   hack/buildroot.sh libnbd-go     print the directory of libnbd's Go
#                                   bindings, of the root's libnbd version
#
# The go command is this machine's (a static program) and sees what it sees
# here at the same paths: the project, the cache, the current directory, the
# KubeVirt output directory, the workspace file's directory, Go's module and
# build caches; they may lie outside the project (KUBEVIRT_TREE,
# KUBEVIRT_OUT). It runs in a mount namespace of its own, so
# nothing stays mounted after it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source-path=SCRIPTDIR source=debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"

readonly SUITE=trixie
readonly PACKAGES=(bash dash coreutils gcc libc6-dev pkgconf libnbd-dev libvirt-dev)

finish_build_root() {
	local root=$1
	echo 'root:x:0:0:root:/root:/bin/bash' >"${root}/etc/passwd"
	echo 'root:x:0:' >"${root}/etc/group"
	mkdir -p "${root}/root" "${root}/proc" "${root}/sys" "${root}/dev"
}

build_root() {
	debian_root build-root "${SUITE}" finish_build_root "${PACKAGES[@]}"
}

# libnbd's Go bindings are generated with the C library and shipped in its
# upstream tarball, which Debian's source package holds; the module proxy
# does not serve them. Pinned by the tarball's checksum. Their callback
# registry is libvirt's Go bindings' own, down to the C symbol it exports,
# freeCallbackId, so a program that links both (virt-launcher) does not
# link: libnbd's copy is renamed, in its two files.
readonly LIBNBD_VERSION=1.22.2
readonly LIBNBD_TARBALL_SHA256=bdc403af00fd1c9b5ed20503765496a81c2d0197af550765af3dee196e8519ca

# libnbd_go prints the directory of the bindings' module, extracted once.
libnbd_go() {
	local dir root version
	dir="${QCOW2_CACHE}/libnbd-go-${LIBNBD_VERSION}-$(declare -f libnbd_go | sha256sum | cut -c1-8)"
	root=$(build_root)
	version=$(sed -n 's/^Version: //p' "${root}"/usr/lib/*/pkgconfig/libnbd.pc)
	[[ ${version} == "${LIBNBD_VERSION}" ]] ||
		die "the build root's libnbd is ${version}, the bindings' ${LIBNBD_VERSION}: pin the bindings of ${version}"
	if [[ ! -f ${dir}/go.mod ]]; then
		local tmp tarball
		tmp=$(mktemp -d)
		(cd "${tmp}" && debian_apt "${SUITE}" -qq source --download-only libnbd >/dev/null)
		tarball=${tmp}/libnbd_${LIBNBD_VERSION}.orig.tar.gz
		[[ -f ${tarball} ]] || die "Debian ${SUITE}'s libnbd source has no ${LIBNBD_VERSION} tarball"
		echo "${LIBNBD_TARBALL_SHA256}  ${tarball}" | sha256sum -c --quiet - || die "${tarball} is not the one pinned"
		mkdir -p "${tmp}/golang"
		tar -xzf "${tarball}" -C "${tmp}/golang" --strip-components=2 "libnbd-${LIBNBD_VERSION}/golang"
		sed -i 's/\bfreeCallbackId\b/libnbdFreeCallbackId/g' "${tmp}/golang/callbacks.go" "${tmp}/golang/wrappers.go"
		rm -rf "${dir}"
		mv "${tmp}/golang" "${dir}"
		rm -rf "${tmp}"
	fi
	echo "${dir}"
}

# in_root ROOT ARGS...: go ARGS inside ROOT; runs in a mount namespace of its
# own (see main).
in_root() {
	local root=$1 path
	shift
	local paths=("${QCOW2_ROOT}" "${QCOW2_CACHE}" "${PWD}" "${KUBEVIRT_OUT}")
	paths+=("$(go env GOROOT)" "$(go env GOMODCACHE)" "$(go env GOCACHE)")
	[[ -z ${GOWORK:-} || ${GOWORK} == off ]] || paths+=("$(dirname "${GOWORK}")")
	for path in "${paths[@]}"; do
		mkdir -p "${path}" "${root}${path}"
		mount --bind "${path}" "${root}${path}"
	done
	# Temporary files land where they would here, not in the cached root.
	mount --bind /tmp "${root}/tmp"
	mount -t proc proc "${root}/proc"
	mount --rbind /dev "${root}/dev"
	mount --rbind /sys "${root}/sys"
	# Name resolution and certificates, for the module proxy.
	local file
	for file in /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt; do
		mkdir -p "$(dirname "${root}${file}")"
		touch "${root}${file}"
		mount --bind "${file}" "${root}${file}"
	done
	exec chroot "${root}" /usr/bin/env -C "${PWD}" PATH="$(go env GOROOT)/bin:/usr/bin" HOME=/root \
		GOMODCACHE="$(go env GOMODCACHE)" GOCACHE="$(go env GOCACHE)" GOFLAGS="-buildvcs=false ${GOFLAGS:-}" \
		go "$@"
}

main() {
	case "${1:-}" in
	path) build_root ;;
	libnbd-go) libnbd_go ;;
	go)
		shift
		local root=${BUILD_ROOT:-}
		[[ -n ${root} ]] || root=$(build_root)
		exec unshare --mount --propagation private -- "${BASH_SOURCE[0]}" in-root "${root}" "$@"
		;;
	in-root)
		shift
		in_root "$@"
		;;
	*) die "usage: $0 path | go ARGS... | libnbd-go" ;;
	esac
}

main "$@"
