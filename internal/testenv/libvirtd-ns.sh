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
