#!/usr/bin/env bash
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

# etcd comes from Debian's etcd-server package, unpacked into the cache: a
# plain install would try to start a system service.
install_etcd() {
	local dest="${QCOW2_CACHE}/etcd"
	[[ -x ${dest}/usr/bin/etcd ]] && return 0
	log "unpacking etcd from Debian's etcd-server package"
	local tmp
	tmp=$(mktemp -d)
	(cd "${tmp}" && apt-get download -qq etcd-server)
	mkdir -p "${dest}"
	dpkg -x "${tmp}"/etcd-server_*.deb "${dest}"
	rm -rf "${tmp}"
}

main() {
	if [[ ${EUID} -ne 0 ]]; then
		die "run as root: installs Debian packages"
	fi
	install_apt_packages
	install_etcd
	log "dependencies present"
}

main "$@"
