#!/usr/bin/env bash
# Runs libvirtd in the foreground with its well-known directories replaced
# by the private ones under the directory given as $1. Meant to run as
# `unshare --mount --propagation slave -- bash libvirtd-ns.sh DIR`: the bind
# mounts below then exist only in the new mount namespace.
set -euo pipefail

readonly private_dir=$1

bind_private_dirs() {
	local pair
	for pair in etc:/etc/libvirt run:/run lib:/var/lib/libvirt log:/var/log/libvirt cache:/var/cache/libvirt; do
		mount --bind "${private_dir}/${pair%%:*}" "${pair#*:}"
	done
}

bind_private_dirs
exec libvirtd --config /etc/libvirt/libvirtd.conf
