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

# Builds the datamover's three images from scratch as OCI image layouts,
# without a container engine, each with a docker archive beside it
# (OUT/images/<name>.tar, for `hack/cluster.sh import`):
#
#   OUT/images/datamover-controller/   the controller, user 65532
#   OUT/images/datamover/              the pods: datamover-upload and
#                                      qemu-img with the libraries it loads
#                                      here, user 107 (KubeVirt's qemu)
#   OUT/images/velero-plugin/          the Velero plugin, user 65532: an
#                                      init container of Velero's (velero
#                                      plugin add) that copies it into
#                                      Velero's plugins directory (/target)
#
# The first two hold this machine's CA bundle at
# /etc/ssl/certs/ca-certificates.crt, where Go looks first, so that they
# reach HTTPS object stores signed by a public authority; a private one
# comes from the location's caCert. The plugin runs in Velero's container,
# with Velero's bundle.
# Usage: hack/datamover-images.sh OUT REGISTRY TAG
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Debian's ca-certificates package writes the bundle there.
readonly CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
readonly IMAGE_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
# The plugin's name in Velero's plugins directory, which every plugin
# image shares (cmd/velero-plugin's InstalledName).
readonly PLUGIN=/plugins/kubevirt-qcow2-velero-plugin

build_binaries() {
	local out=$1
	mkdir -p "${out}/static" "${out}/bin"
	(
		cd "${QCOW2_ROOT}"
		CGO_ENABLED=0 go build -trimpath -ldflags='-s -w -buildid=' -o "${out}/static/" \
			./cmd/datamover-controller ./cmd/datamover-upload ./cmd/velero-plugin
		go build -trimpath -o "${out}/bin/oci-image" ./cmd/oci-image
	)
}

build_images() {
	local out=$1 registry=$2 tag=$3 qemu_img
	qemu_img=$(command -v qemu-img) || die "qemu-img missing: run hack/install-deps.sh"
	"${out}/bin/oci-image" --out "${out}/images/datamover-controller" --archive "${out}/images/datamover-controller.tar" \
		--ref "${registry}/datamover-controller:${tag}" \
		--file "${out}/static/datamover-controller:/usr/bin/datamover-controller:0755" \
		--file "${CA_BUNDLE}:${IMAGE_CA_BUNDLE}:0644" \
		--entrypoint /usr/bin/datamover-controller --user 65532
	"${out}/bin/oci-image" --out "${out}/images/datamover" --archive "${out}/images/datamover.tar" \
		--ref "${registry}/datamover:${tag}" \
		--file "${out}/static/datamover-upload:/usr/bin/datamover-upload:0755" \
		--elf "${qemu_img}:/usr/bin/qemu-img:0755" \
		--file "${CA_BUNDLE}:${IMAGE_CA_BUNDLE}:0644" \
		--entrypoint /usr/bin/datamover-upload --user 107:107
	"${out}/bin/oci-image" --out "${out}/images/velero-plugin" --archive "${out}/images/velero-plugin.tar" \
		--ref "${registry}/velero-plugin:${tag}" \
		--file "${out}/static/velero-plugin:${PLUGIN}:0755" \
		--entrypoint "${PLUGIN} install /target" --user 65532
}

main() {
	[[ $# -eq 3 ]] || die "usage: $0 OUT REGISTRY TAG"
	local out
	out=$(mkdir -p "$1" && cd "$1" && pwd)
	[[ -s ${CA_BUNDLE} ]] || die "no CA bundle at ${CA_BUNDLE}: install ca-certificates or set CA_BUNDLE"
	build_binaries "${out}"
	build_images "${out}" "$2" "$3"
}

main "$@"
