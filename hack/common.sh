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

# Shared settings for the hack/ scripts. Sourced, not run.

QCOW2_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Built tools (kube-apiserver, etcd, generators) outlive a work tree.
QCOW2_CACHE=${QCOW2_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/kubevirt-qcow2}
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.7.0}
KUBEVIRT_TREE=${KUBEVIRT_TREE:-${QCOW2_ROOT}/_build/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_PATCHES=${KUBEVIRT_PATCHES:-${QCOW2_ROOT}/patches/kubevirt-${KUBEVIRT_VERSION}}
KUBEVIRT_OUT=${KUBEVIRT_OUT:-${QCOW2_ROOT}/_out/kubevirt-${KUBEVIRT_VERSION}}

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }
