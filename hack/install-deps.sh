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

# Installs what a fresh Debian 12 machine lacks to build and test the project:
# Debian packages (QEMU, libvirt, build tools) and etcd extracted from its
# Debian package without starting a service. Idempotent: does nothing when
# everything is present.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly APT_PACKAGES=(
	qemu-utils qemu-system-x86 seabios
	libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-system libvirt-clients libvirt-dev
	binutils pkg-config gcc musl-tools make git util-linux e2fsprogs kmod
	shellcheck
)

missing_apt_packages() {
	local pkg
	for pkg in "${APT_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}\n' "${pkg}" 2>/dev/null | grep -q '^install ok installed$' || echo "${pkg}"
	done
}

install_apt_packages() {
	local missing
	mapfile -t missing < <(missing_apt_packages)
	[[ ${#missing[@]} -eq 0 ]] && return 0
	log "installing Debian packages: ${missing[*]}"
	# No init system here: keep maintainer scripts from starting daemons.
	local policy=/usr/sbin/policy-rc.d created_policy=
	if [[ ! -e ${policy} ]]; then
		printf '#!/bin/sh\nexit 101\n' >"${policy}"
		chmod 0755 "${policy}"
		created_policy=1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	[[ -n ${created_policy} ]] && rm -f "${policy}"
	return 0
}

# Debian packages whose programs the tests run but which must not be
# installed: installing them would start system services. They are unpacked
# into the cache instead, one directory per package set.
unpack_debs() {
	local dest=$1 probe=$2
	shift 2
	[[ -x ${dest}/${probe} ]] && return 0
	log "unpacking Debian packages $* into the cache"
	local tmp deb
	tmp=$(mktemp -d)
	chmod 0755 "${tmp}" # apt downloads as its own user
	(cd "${tmp}" && apt-get download -qq "$@")
	rm -rf "${dest}.tmp"
	mkdir -p "${dest}.tmp"
	for deb in "${tmp}"/*.deb; do
		dpkg -x "${deb}" "${dest}.tmp"
	done
	rm -rf "${tmp}" "${dest}"
	mv "${dest}.tmp" "${dest}"
}

main() {
	if [[ ${EUID} -ne 0 ]]; then
		die "run as root: installs Debian packages"
	fi
	install_apt_packages
	# etcd for envtest and the one-node cluster (hack/cluster.sh).
	unpack_debs "${QCOW2_CACHE}/etcd" usr/bin/etcd etcd-server
	# The one-node cluster's container runtime and pod network.
	unpack_debs "${QCOW2_CACHE}/node" usr/bin/containerd containerd runc containernetworking-plugins
	log "dependencies present"
}

main "$@"
