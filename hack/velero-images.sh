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

# Builds images of Velero and its AWS object store plugin from the
# binaries hack/velero.sh builds from the Go module proxy, from scratch and
# without a container engine, each as an OCI image layout and a docker
# archive (for `hack/cluster.sh import`), tagged with their release:
#
#   OUT/images/velero[.tar]                 /velero (server, node-agent,
#                                           CLI), /velero-helper and
#                                           /velero-restore-helper where
#                                           Velero's image has them, this
#                                           machine's CA bundle, a /tmp,
#                                           a home for kopia's files;
#                                           user 65532 (`velero install`
#                                           runs the node-agent as root)
#   OUT/images/velero-plugin-for-aws[.tar]  the plugin under /plugins and
#                                           its cp-plugin entrypoint, which
#                                           copies it into /target, the
#                                           plugins directory `velero
#                                           install --plugins` mounts there
#
# Usage: hack/velero-images.sh OUT REGISTRY
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
readonly AWS_PLUGIN=/plugins/velero-plugin-for-aws

# versions DIR: Velero's and the AWS plugin's releases, from the name of
# the directory hack/velero.sh prints (velero-<version>-aws-<version>).
versions() {
	local dir=$1 name
	name=$(basename "${dir}")
	[[ ${name} =~ ^velero-(v[^-]+)-aws-(v.+)$ ]] || die "unexpected directory ${dir}"
	echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
}

main() {
	[[ $# -eq 2 ]] || die "usage: $0 OUT REGISTRY"
	local out registry=$2 bin velero_version aws_version
	out=$(mkdir -p "$1" && cd "$1" && pwd)
	[[ -s ${CA_BUNDLE} ]] || die "no CA bundle at ${CA_BUNDLE}: install ca-certificates or set CA_BUNDLE"
	bin=$("${QCOW2_ROOT}/hack/velero.sh")
	read -r velero_version aws_version < <(versions "${bin}")
	mkdir -p "${out}/bin"
	(cd "${QCOW2_ROOT}" && go build -trimpath -o "${out}/bin/oci-image" ./cmd/oci-image)

	# Velero writes temporary files (a backup's tarball before upload)
	# to the default temporary directory, and kopia the configuration of
	# the file-system backups' repositories under its user's home.
	TREE=$(mktemp -d)
	trap 'rm -rf "${TREE}"' EXIT
	mkdir -p "${TREE}/tmp" "${TREE}/home/velero"
	chmod 1777 "${TREE}/tmp" "${TREE}/home/velero"
	"${out}/bin/oci-image" --out "${out}/images/velero" --archive "${out}/images/velero.tar" \
		--ref "${registry}/velero:${velero_version}" --tree "${TREE}" \
		--file "${bin}/velero:/velero:0755" \
		--file "${bin}/velero-helper:/velero-helper:0755" \
		--file "${bin}/velero-restore-helper:/velero-restore-helper:0755" \
		--file "${CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:0644" \
		--entrypoint /velero --user 65532 --env HOME=/home/velero
	"${out}/bin/oci-image" --out "${out}/images/velero-plugin-for-aws" \
		--archive "${out}/images/velero-plugin-for-aws.tar" \
		--ref "${registry}/velero-plugin-for-aws:${aws_version}" \
		--file "${bin}/velero-plugin-for-aws:${AWS_PLUGIN}:0755" \
		--file "${bin}/cp-plugin:/bin/cp-plugin:0755" \
		--entrypoint "/bin/cp-plugin ${AWS_PLUGIN} /target/velero-plugin-for-aws" --user 65532
}

main "$@"
