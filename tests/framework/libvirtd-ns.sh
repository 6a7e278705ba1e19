#!/usr/bin/env bash
# Runs libvirtd in the foreground with its well-known directories replaced
# by private ones. Usage: libvirtd-ns.sh DIR SUBDIR:PATH...; each DIR/SUBDIR
# is bind-mounted over PATH. Meant to run as `unshare --mount --propagation
# slave -- bash libvirtd-ns.sh ...`: the bind mounts then exist only in the
# new mount namespace.
set -euo pipefail

bind_private_dirs() {
	local private_dir=$1 pair
	shift
	for pair in "$@"; do
		mount --bind "${private_dir}/${pair%%:*}" "${pair#*:}"
	done
}

bind_private_dirs "$@"
exec libvirtd --config /etc/libvirt/libvirtd.conf
