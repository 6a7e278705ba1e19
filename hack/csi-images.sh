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

# Builds the images of deploy/csi-loop from scratch, without a container
# engine, each as an OCI image layout and a docker archive (for
# `hack/cluster.sh import`):
#
#   OUT/images/csi-loop[.tar]          the driver: one static binary that
#                                      drives loop devices by ioctl, no
#                                      util-linux
#   OUT/images/csi-provisioner[.tar]   external-provisioner and
#   OUT/images/csi-resizer[.tar]       external-resizer, built from the Go
#                                      module proxy (hack/csi-sidecars.sh),
#                                      at / as upstream's images have them
#
# All run as root: the driver attaches loop devices and mounts, the
# sidecars reach its root-owned socket.
# Usage: hack/csi-images.sh OUT REGISTRY TAG
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_binaries() {
	local out=$1 tag=$2
	mkdir -p "${out}/static" "${out}/bin"
	(
		cd "${QCOW2_ROOT}"
		CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -buildid= -X main.version=${tag}" -o "${out}/static/" ./cmd/csi-loop
		go build -trimpath -o "${out}/bin/oci-image" ./cmd/oci-image
	)
}

image() {
	local out=$1 name=$2 ref=$3
	shift 3
	"${out}/bin/oci-image" --out "${out}/images/${name}" --archive "${out}/images/${name}.tar" --ref "${ref}" "$@"
}

main() {
	[[ $# -eq 3 ]] || die "usage: $0 OUT REGISTRY TAG"
	local out registry=$2 tag=$3 sidecars
	out=$(mkdir -p "$1" && cd "$1" && pwd)
	sidecars=$("${QCOW2_ROOT}/hack/csi-sidecars.sh")
	build_binaries "${out}" "${tag}"
	image "${out}" csi-loop "${registry}/csi-loop:${tag}" \
		--file "${out}/static/csi-loop:/usr/bin/csi-loop:0755" --entrypoint /usr/bin/csi-loop
	image "${out}" csi-provisioner "${registry}/csi-provisioner:${tag}" \
		--file "${sidecars}/csi-provisioner:/csi-provisioner:0755" --entrypoint /csi-provisioner
	image "${out}" csi-resizer "${registry}/csi-resizer:${tag}" \
		--file "${sidecars}/csi-resizer:/csi-resizer:0755" --entrypoint /csi-resizer
}

main "$@"
