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

# Root file systems made from a Debian release's packages, whatever release
# this machine runs: the node base of the KubeVirt images and the build root
# of the binaries that link its libraries. Sourced after common.sh.

# debian_apt SUITE ARGS...: apt-get on SUITE's packages (main, with its
# updates and security fixes), through a configuration of its own in the
# cache, refreshed once a day, and an empty package status, so that apt
# resolves whole closures, as for an empty root. The machine's own apt
# setup is neither read nor changed.
debian_apt() {
	local suite=$1
	shift
	local dir="${QCOW2_CACHE}/apt/${suite}"
	local options=(-o Dir::Etc::sourcelist="${dir}/sources.list" -o Dir::Etc::sourceparts=-
		-o Dir::State::lists="${dir}/lists" -o Dir::State::status=/dev/null
		-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg sources
	sources="deb [signed-by=${keyring}] http://deb.debian.org/debian ${suite} main
deb [signed-by=${keyring}] http://deb.debian.org/debian ${suite}-updates main
deb [signed-by=${keyring}] http://deb.debian.org/debian-security ${suite}-security main
deb-src [signed-by=${keyring}] http://deb.debian.org/debian ${suite} main"
	if [[ ! -f ${dir}/updated || $(<"${dir}/sources.list") != "${sources}" || -n $(find "${dir}/updated" -mmin +1440) ]]; then
		mkdir -p "${dir}/lists/partial"
		printf '%s\n' "${sources}" >"${dir}/sources.list"
		apt-get "${options[@]}" -qq update >/dev/null || die "cannot read Debian ${suite}'s package lists"
		touch "${dir}/updated"
	fi
	apt-get "${options[@]}" "$@"
}

# debian_root NAME SUITE FINISH PACKAGE...: a root file system of PACKAGE and
# all they depend on from SUITE, unpacked without maintainer scripts, with a
# merged /usr, then completed by the function FINISH given the root's
# directory. Made once per set of package versions and per FINISH's text
# (what FINISH reads from variables belongs in NAME); prints its
# directory.
debian_root() {
	local name=$1 suite=$2 finish=$3
	shift 3
	local debs key dir tmp
	debs=$(debian_apt "${suite}" --print-uris -qq install -y --no-install-recommends "$@" | awk '{print $2}' | sort)
	[[ -n ${debs} ]] || die "apt resolved no packages for ${name}"
	key=$( (printf '%s\n' "${debs}" && declare -f debian_root "${finish}") | sha256sum | cut -c1-16)
	dir="${QCOW2_CACHE}/roots/${name}-${suite}-${key}"
	if [[ ! -d ${dir} ]]; then
		log "unpacking ${name} from $(wc -l <<<"${debs}") Debian ${suite} packages (once per package set)"
		tmp=$(mktemp -d)
		mkdir -p "${tmp}/debs/partial" "${tmp}/root"
		chmod -R 0755 "${tmp}"
		debian_apt "${suite}" -qq -o Dir::Cache::archives="${tmp}/debs" \
			install -y --download-only --no-install-recommends "$@" >/dev/null
		local deb
		for deb in "${tmp}"/debs/*.deb; do
			dpkg -x "${deb}" "${tmp}/root"
		done
		# Debian systems have a merged /usr (/bin a link to usr/bin) that
		# debootstrap, not a package, makes; Debian 12's packages still
		# ship files under /bin (KubeVirt's pods run /usr/bin/cp, for one),
		# Debian 13's none, not even the loader programs name.
		local top
		for top in bin sbin lib lib64; do
			if [[ -d ${tmp}/root/${top} && ! -L ${tmp}/root/${top} ]]; then
				mkdir -p "${tmp}/root/usr/${top}"
				cp -a "${tmp}/root/${top}/." "${tmp}/root/usr/${top}/"
				rm -rf "${tmp:?}/root/${top}"
			fi
			[[ -e ${tmp}/root/${top} || ! -d ${tmp}/root/usr/${top} ]] || ln -s "usr/${top}" "${tmp}/root/${top}"
		done
		mkdir -p "${tmp}/root/tmp"
		chmod 1777 "${tmp}/root/tmp"
		"${finish}" "${tmp}/root"
		ldconfig -r "${tmp}/root"
		# ldconfig's own cache records when it ran: not part of the root.
		rm -f "${tmp}/root/var/cache/ldconfig/aux-cache"
		mkdir -p "$(dirname "${dir}")"
		mv "${tmp}/root" "${dir}"
		rm -rf "${tmp}"
	fi
	echo "${dir}"
}
