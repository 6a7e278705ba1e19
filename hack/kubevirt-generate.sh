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

# Regenerates, in the patched KubeVirt tree, everything a change to the API
# types needs: the same generators, versions and order as the tree's own
# hack/generate.sh (versions pinned by hack/builder/Dockerfile), without the
# builder container.
#
#   tools        build the generators into the cache (idempotent)
#   generate     build the tools, then regenerate in the tree (default)
#   verify       generate, then fail if the tree differs from its last commit
#   build-files  only update the BUILD.bazel files (gazelle)
#
# Regenerated: swagger docs, deepcopy, defaulters, conversions, client-go's
# openapi_generated.go (with the API rule violation check), the CRD
# validation schemas (validations_generated.go, through controller-gen and
# tools/crd-validation-generator), api/openapi-spec/swagger.json, the API
# round-trip fixtures of kubevirt.io/api/apitesting (testdata/HEAD) and the
# BUILD.bazel files of the Go packages (gazelle); also virt-launcher's
# internal domain types' deepcopy and the mocks of every Go file the series
# changes (its //go:generate mockgen line).
# The operator's manifests (manifests/generated, tools/resource-generator):
# the KubeVirt CRD in them carries the configuration's schema, and the API
# server drops fields a CRD's schema lacks. The metrics reference,
# docs/observability/metrics.md (tools/doc-generator), as the series adds
# metrics.
# Not regenerated, because nothing the series changes feeds them:
# clientsets (no new kinds), protobuf, the OLM CSV and examples.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Versions from hack/builder/Dockerfile of KubeVirt v1.7.0; v1.8.3's pins
# the same.
readonly CODE_GENERATOR_VERSION=v0.32.5
readonly CONTROLLER_TOOLS_VERSION=v0.16.3
# controller-tools v0.16.3 requires golang.org/x/tools v0.24.0, which does not
# compile with current Go; v0.30.0 is the oldest that does and behaves alike.
readonly CONTROLLER_TOOLS_X_TOOLS_VERSION=v0.30.0
readonly SWAGGER_DOC_VERSION=v0.0.0-20181110145135-878f7deb1d17
# bazel_gazelle in KubeVirt v1.7.0's WORKSPACE, and in v1.8.3's.
readonly GAZELLE_VERSION=v0.39.1
readonly OPENAPI_RULES_UNKNOWN_TO_PINNED_GENERATOR='^API rule violation: streaming_list_type_json_tags,'

readonly GENERATORS_DIR="${QCOW2_CACHE}/generators"
# Generators write their own name into the files they generate, so each
# binary keeps its plain name in a directory per version.
readonly TOOLS_DIR="${GENERATORS_DIR}/bin"
# KubeVirt's own tools, compiled from the tree on every run: they link the
# (patched) API types.
readonly TREE_BIN="${GENERATORS_DIR}/tree-bin/${KUBEVIRT_VERSION}"

readonly API_DIR=staging/src/kubevirt.io/api
readonly CLIENT_GO_DIR=staging/src/kubevirt.io/client-go
readonly BOILERPLATE=hack/boilerplate/boilerplate.go.txt
readonly VALIDATIONS_GO=pkg/virt-operator/resource/generate/components/validations_generated.go

# API group versions, in hack/generate.sh's order.
SWAGGER_DOC_FILES=(
	core/v1/types.go
	core/v1/schema.go
	snapshot/v1alpha1/types.go
	snapshot/v1beta1/types.go
	instancetype/v1beta1/types.go
	pool/v1alpha1/types.go
	pool/v1beta1/types.go
	migrations/v1alpha1/types.go
	export/v1alpha1/types.go
	export/v1beta1/types.go
	clone/v1alpha1/types.go
	clone/v1beta1/types.go
)
DEEPCOPY_PACKAGES=(
	kubevirt.io/api/snapshot/v1alpha1
	kubevirt.io/api/snapshot/v1beta1
	kubevirt.io/api/export/v1alpha1
	kubevirt.io/api/export/v1beta1
	kubevirt.io/api/instancetype/v1beta1
	kubevirt.io/api/pool/v1alpha1
	kubevirt.io/api/pool/v1beta1
	kubevirt.io/api/migrations/v1alpha1
	kubevirt.io/api/clone/v1alpha1
	kubevirt.io/api/clone/v1beta1
	kubevirt.io/api/core/v1
)
OPENAPI_PACKAGES=(
	k8s.io/api/core/v1
	k8s.io/apimachinery/pkg/api/resource
	k8s.io/apimachinery/pkg/apis/meta/v1
	k8s.io/apimachinery/pkg/runtime
	k8s.io/apimachinery/pkg/util/intstr
	kubevirt.io/api/core/v1
	kubevirt.io/api/clone/v1alpha1
	kubevirt.io/api/clone/v1beta1
	kubevirt.io/api/export/v1alpha1
	kubevirt.io/api/export/v1beta1
	kubevirt.io/api/instancetype/v1beta1
	kubevirt.io/api/migrations/v1alpha1
	kubevirt.io/api/pool/v1alpha1
	kubevirt.io/api/pool/v1beta1
	kubevirt.io/api/snapshot/v1alpha1
	kubevirt.io/api/snapshot/v1beta1
	kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1
)
# controller-gen invocations: "<extra crd options>:<package dir>".
CRD_PACKAGES=(
	":allowDangerousTypes=true:core/v1"
	"::snapshot/v1alpha1"
	"::snapshot/v1beta1"
	"::export/v1alpha1"
	"::export/v1beta1"
	"::instancetype/v1beta1"
	"::pool/v1alpha1"
	"::pool/v1beta1"
	"::migrations/v1alpha1"
	"::clone/v1alpha1"
	"::clone/v1beta1"
)
# resource-generator's kv-cr arguments beyond v1.7.0's.
KV_CR_ARGS=()
# What v1.8's hack/generate.sh adds: the backup API group (after clone,
# and before the CDI package for openapi-gen) and the hypervisor of the
# KubeVirt CR template.
if [[ ${KUBEVIRT_VERSION} == v1.8.3 ]]; then
	SWAGGER_DOC_FILES+=(backup/v1alpha1/types.go)
	DEEPCOPY_PACKAGES=("${DEEPCOPY_PACKAGES[@]:0:${#DEEPCOPY_PACKAGES[@]}-1}" kubevirt.io/api/backup/v1alpha1 kubevirt.io/api/core/v1)
	OPENAPI_PACKAGES=("${OPENAPI_PACKAGES[@]:0:${#OPENAPI_PACKAGES[@]}-1}" kubevirt.io/api/backup/v1alpha1
		kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1)
	CRD_PACKAGES+=("::backup/v1alpha1")
	KV_CR_ARGS+=(--hypervisor='{{.Hypervisor}}')
fi
readonly SWAGGER_DOC_FILES DEEPCOPY_PACKAGES OPENAPI_PACKAGES CRD_PACKAGES KV_CR_ARGS

# Commands in the tree run with the workspace its version needs
# (kubevirt_gowork in common.sh).
TREE_GOWORK=$(kubevirt_gowork "${KUBEVIRT_TREE}")
in_tree() { (cd "${KUBEVIRT_TREE}" && GOWORK=${TREE_GOWORK} "$@"); }

tool() { echo "${TOOLS_DIR}/$1/$2/$1"; }

# Version of a module as the tree's workspace resolves it (replacements
# included).
tree_module_version() {
	in_tree go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$1"
}

# A module of its own for a tool whose pinned version cannot be installed
# with a plain `go install tool@version`; requirements are module@version.
build_in_tools_module() {
	local name=$1 version=$2 package=$3
	shift 3
	local bin
	bin=$(tool "${name}" "${version}")
	[[ -x ${bin} ]] && return 0
	log "building ${name} ${version}"
	local dir="${GENERATORS_DIR}/modules/${name}-${version}"
	mkdir -p "${dir}"
	if [[ ! -f ${dir}/go.mod ]]; then
		(cd "${dir}" && go mod init "kubevirt-qcow2.tools/${name}" >/dev/null 2>&1)
	fi
	(cd "${dir}" && GOFLAGS=-mod=mod go get "$@" >/dev/null 2>&1) ||
		die "cannot resolve $* for ${name}"
	(cd "${dir}" && GOFLAGS=-mod=mod go build -o "${bin}" "${package}")
}

# A tool that installs as is from the module proxy.
install_tool() {
	local name=$1 version=$2 package=$3
	local bin
	bin=$(tool "${name}" "${version}")
	[[ -x ${bin} ]] && return 0
	log "building ${name} ${version}"
	GOBIN=$(dirname "${bin}") go install "${package}@${version}"
}

build_code_generators() {
	local name
	for name in deepcopy-gen defaulter-gen conversion-gen; do
		install_tool "${name}" "${CODE_GENERATOR_VERSION}" "k8s.io/code-generator/cmd/${name}"
	done
}

# The Dockerfile pins openapi-gen to a bare kube-openapi commit that the
# module proxy does not serve; use the kube-openapi (and gengo) the tree
# itself builds against, outside the tree so that its go.work.sum stays as
# it is.
build_openapi_gen() {
	local openapi module requirements=()
	openapi=$(tree_module_version k8s.io/kube-openapi)
	for module in k8s.io/kube-openapi k8s.io/gengo/v2 golang.org/x/tools; do
		requirements+=("${module}@$(tree_module_version "${module}")")
	done
	build_in_tools_module openapi-gen "${openapi}" k8s.io/kube-openapi/cmd/openapi-gen \
		"${requirements[@]}"
	OPENAPI_GEN=$(tool openapi-gen "${openapi}")
}

build_tools() {
	build_code_generators
	build_in_tools_module controller-gen "${CONTROLLER_TOOLS_VERSION}" \
		sigs.k8s.io/controller-tools/cmd/controller-gen \
		"sigs.k8s.io/controller-tools@${CONTROLLER_TOOLS_VERSION}" \
		"golang.org/x/tools@${CONTROLLER_TOOLS_X_TOOLS_VERSION}"
	build_in_tools_module swagger-doc "${SWAGGER_DOC_VERSION}" \
		github.com/rmohr/go-swagger-utils/swagger-doc \
		"github.com/rmohr/go-swagger-utils@${SWAGGER_DOC_VERSION}"
	build_openapi_gen
	install_tool gazelle "${GAZELLE_VERSION}" github.com/bazelbuild/bazel-gazelle/cmd/gazelle
}

build_tree_tool() {
	mkdir -p "${TREE_BIN}"
	in_tree go build -o "${TREE_BIN}/$1" "./tools/$1"
}

generate_swagger_docs() {
	log "swagger-doc"
	local file
	for file in "${SWAGGER_DOC_FILES[@]}"; do
		in_tree "$(tool swagger-doc "${SWAGGER_DOC_VERSION}")" -in "${API_DIR}/${file}"
	done
}

generate_deepcopy_defaulters_conversions() {
	log "deepcopy-gen, defaulter-gen"
	in_tree "$(tool deepcopy-gen "${CODE_GENERATOR_VERSION}")" \
		--bounding-dirs kubevirt.io/api \
		--go-header-file "${BOILERPLATE}" \
		--output-file deepcopy_generated.go \
		"${DEEPCOPY_PACKAGES[@]}"
	in_tree "$(tool defaulter-gen "${CODE_GENERATOR_VERSION}")" \
		--output-file zz_generated.defaults.go \
		--go-header-file "${BOILERPLATE}" \
		kubevirt.io/api/core/v1
}

generate_openapi() {
	log "openapi-gen"
	in_tree "${OPENAPI_GEN}" \
		--output-dir "${CLIENT_GO_DIR}/api/" \
		--output-pkg kubevirt.io/client-go/api/ \
		--output-file openapi_generated.go \
		--report-filename api/api-rule-violations.list \
		--go-header-file "${BOILERPLATE}" \
		"${OPENAPI_PACKAGES[@]}"
	log "conversion-gen"
	in_tree "$(tool conversion-gen "${CODE_GENERATOR_VERSION}")" \
		--go-header-file "${BOILERPLATE}" \
		--output-file conversion_generated.go \
		kubevirt.io/api/instancetype/v1beta1
	# The tree's kube-openapi knows a rule the pinned commit did not; its
	# findings concern list types KubeVirt did not change and are dropped so
	# the report stays comparable with the known list.
	local report="${KUBEVIRT_TREE}/api/api-rule-violations.list"
	grep -v "${OPENAPI_RULES_UNKNOWN_TO_PINNED_GENERATOR}" "${report}" >"${report}.new" || true
	mv "${report}.new" "${report}"
	if ! in_tree diff -u api/api-rule-violations-known.list api/api-rule-violations.list; then
		die "the API change introduces new API rule violations (diff above)"
	fi
}

# controller-gen writes CRDs into client-go/config/crd; the first two lines
# of each are dropped as hack/generate.sh does, and the in-tree generator
# turns their schemas into virt-operator's validations_generated.go.
generate_crd_validations() {
	log "controller-gen, crd-validation-generator"
	local entry options dir file
	local crd_dir="${KUBEVIRT_TREE}/${CLIENT_GO_DIR}/config"
	rm -rf "${crd_dir}"
	for entry in "${CRD_PACKAGES[@]}"; do
		options=${entry#:}
		dir=${options#*:}
		options=${options%%:*}
		(cd "${KUBEVIRT_TREE}/${CLIENT_GO_DIR}" &&
			GOWORK=${TREE_GOWORK} GOFLAGS="" "$(tool controller-gen "${CONTROLLER_TOOLS_VERSION}")" \
				"crd${options:+:${options}}" "paths=../api/${dir}/")
	done
	for file in "${crd_dir}"/crd/*; do
		tail -n +3 "${file}" >"${file}.new"
		mv "${file}.new" "${file}"
	done
	in_tree "${TREE_BIN}/crd-validation-generator"
	rm -rf "${crd_dir}"
	# KubeVirt's `make generate` formats the tree afterwards (bazel-fmt.sh).
	in_tree gofmt -w "${VALIDATIONS_GO}"
}

generate_openapi_spec() {
	log "openapispec"
	in_tree "${TREE_BIN}/openapispec" --dump-api-spec-path api/openapi-spec/swagger.json
}

# The same resource-generator calls as hack/generate.sh.
generate_manifests() {
	log "resource-generator"
	local gen="${TREE_BIN}/resource-generator" dir=manifests/generated
	in_tree "${gen}" --type=priorityclass >"${KUBEVIRT_TREE}/${dir}/kubevirt-priority-class.yaml"
	in_tree "${gen}" --type=kv >"${KUBEVIRT_TREE}/${dir}/kv-resource.yaml"
	in_tree "${gen}" --type=networkpolicies --namespace='{{.Namespace}}' \
		>"${KUBEVIRT_TREE}/${dir}/kubevirt-network-policies.yaml.in"
	in_tree "${gen}" --type=kv-cr --namespace='{{.Namespace}}' --pullPolicy='{{.ImagePullPolicy}}' \
		--featureGates='{{.FeatureGates}}' --infraReplicas='{{.InfraReplicas}}' "${KV_CR_ARGS[@]}" \
		>"${KUBEVIRT_TREE}/${dir}/kubevirt-cr.yaml.in"
	in_tree "${gen}" --type=operator-rbac --namespace='{{.Namespace}}' \
		>"${KUBEVIRT_TREE}/${dir}/rbac-operator.authorization.k8s.yaml.in"
}

# The same doc-generator call as hack/generate.sh.
generate_metrics_docs() {
	log "doc-generator (docs/observability/metrics.md)"
	(cd "${KUBEVIRT_TREE}/docs/observability" && "${TREE_BIN}/doc-generator" >metrics.md)
}

# kubevirt.io/api/apitesting round-trips fuzzed objects through fixtures;
# hack/update-generated-api-testdata.sh rewrites the HEAD ones.
generate_api_testdata() {
	log "API round-trip fixtures (apitesting/testdata/HEAD)"
	local testdata="${KUBEVIRT_TREE}/${API_DIR}/apitesting/testdata/HEAD"
	rm -f "${testdata}"/*.yaml "${testdata}"/*.json
	in_tree env UPDATE_COMPATIBILITY_FIXTURE_DATA=true \
		go test -count=1 kubevirt.io/api/apitesting -run //HEAD >/dev/null 2>&1 || true
	in_tree go test -count=1 kubevirt.io/api/apitesting -run //HEAD >/dev/null ||
		die "API round-trip fixtures do not pass after regeneration"
}

# BUILD.bazel files as the tree's hack/bazel-fmt.sh has gazelle write them
# (`bazel run //:gazelle -- pkg/ tools/ tests/ cmd/`, with the root
# BUILD.bazel's build_tags = ["selinux"]), without Bazel:
# - KubeVirt resolves imports from outside the tree to its vendored
#   packages; the module proxy has no vendor/, so -external=vendored names
#   the same //vendor/... labels.
# - The BUILD.bazel files of the staging modules are not in their module
#   zips (their .gitignore drops them), yet gazelle needs them to resolve
#   kubevirt.io/api and kubevirt.io/client-go to //staging/src/...: they are
#   generated in the same run and removed afterwards.
# virt-launcher's domain types (what it reports to virt-handler) have their
# own deepcopy, outside the API's bounding dirs, as in the tree's
# hack/generate.sh.
generate_launcher_deepcopy() {
	log "deepcopy-gen (virtwrap/api)"
	in_tree "$(tool deepcopy-gen "${CODE_GENERATOR_VERSION}")" \
		--go-header-file "${BOILERPLATE}" \
		--output-file deepcopy_generated.go \
		./pkg/virt-launcher/virtwrap/api
}

# Mocks of the Go files the series changes, from their own //go:generate
# lines (all write generated_mock_$GOFILE), with the tree's mockgen version,
# then formatted with goimports as the tree's hack/bazel-fmt.sh does.
generate_mocks() {
	local version file
	version=$(tree_module_version go.uber.org/mock)
	# mockgen's own golang.org/x/tools does not compile with current Go.
	build_in_tools_module mockgen "${version}" go.uber.org/mock/mockgen \
		"go.uber.org/mock@${version}" "golang.org/x/tools@${CONTROLLER_TOOLS_X_TOOLS_VERSION}"
	install_tool goimports "${CONTROLLER_TOOLS_X_TOOLS_VERSION}" golang.org/x/tools/cmd/goimports
	while read -r file; do
		[[ -f ${KUBEVIRT_TREE}/${file} ]] || continue
		grep -q '^//go:generate mockgen' "${KUBEVIRT_TREE}/${file}" || continue
		log "mockgen ${file}"
		(cd "${KUBEVIRT_TREE}/$(dirname "${file}")" &&
			GOWORK=${TREE_GOWORK} PATH="$(dirname "$(tool mockgen "${version}")"):${PATH}" go generate -run mockgen "$(basename "${file}")" &&
			"$(tool goimports "${CONTROLLER_TOOLS_X_TOOLS_VERSION}")" -local kubevirt.io/kubevirt -w "generated_mock_$(basename "${file}")")
	done < <(git -C "${KUBEVIRT_TREE}" diff --name-only pristine -- '*.go')
}

generate_build_files() {
	[[ -e ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run hack/kubevirt.sh apply"
	install_tool gazelle "${GAZELLE_VERSION}" github.com/bazelbuild/bazel-gazelle/cmd/gazelle
	log "gazelle"
	local staging=(staging/src/kubevirt.io/api staging/src/kubevirt.io/client-go)
	local kept
	kept=$(in_tree find "${staging[@]}" -name BUILD.bazel)
	local status=0
	in_tree "$(tool gazelle "${GAZELLE_VERSION}")" update -external=vendored -build_tags=selinux \
		"${staging[@]}" pkg/ tools/ tests/ cmd/ || status=$?
	local file
	while read -r file; do
		grep -qxF "${file}" <<<"${kept}" || rm -f "${KUBEVIRT_TREE}/${file}"
	done < <(in_tree find "${staging[@]}" -name BUILD.bazel)
	[[ ${status} -eq 0 ]] || die "gazelle failed"
}

generate() {
	[[ -e ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run hack/kubevirt.sh apply"
	build_tools
	build_tree_tool crd-validation-generator
	generate_swagger_docs
	generate_deepcopy_defaulters_conversions
	generate_openapi
	generate_crd_validations
	# openapispec links the openapi definitions generated above.
	build_tree_tool openapispec
	generate_openapi_spec
	# resource-generator links the CRD validations generated above.
	build_tree_tool resource-generator
	generate_manifests
	build_tree_tool doc-generator
	generate_metrics_docs
	generate_api_testdata
	generate_launcher_deepcopy
	generate_mocks
	generate_build_files
	log "regenerated; review with: git -C ${KUBEVIRT_TREE} status"
}

verify() {
	generate
	local changes
	changes=$(git -C "${KUBEVIRT_TREE}" status --porcelain)
	if [[ -n ${changes} ]]; then
		printf '%s\n' "${changes}" >&2
		die "generated files differ from the tree's last commit"
	fi
	log "generated files are up to date"
}

usage() {
	echo "usage: $0 [tools|generate|verify|build-files]" >&2
	exit 2
}

main() {
	local cmd=${1:-generate}
	case "${cmd}" in
	tools) build_tools ;;
	generate) generate ;;
	verify) verify ;;
	build-files) generate_build_files ;;
	*) usage ;;
	esac
}

main "$@"
