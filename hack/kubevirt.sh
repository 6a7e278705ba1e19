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

# The patched-KubeVirt cycle:
#   assemble  pristine tree from the Go module proxy, git baseline tagged
#   apply     reset the tree to the baseline and `git am` the series
#   export    write the tree's commits back into patches/ (byte-stable)
#   build     build the KubeVirt binaries from the tree into _out/
#   test      KubeVirt's unit tests of every package the series touches,
#             patched against pristine (pristine results cached per package)
#   check     every commit of the series in turn: the binaries build, and
#             the unit tests of the packages it changes, against pristine
# Each step is idempotent. KUBEVIRT_VERSION picks the KubeVirt release and
# its series (v1.8.3, the default, or v1.7.0); paths come from common.sh
# and may be overridden through the environment (KUBEVIRT_TREE,
# KUBEVIRT_PATCHES, KUBEVIRT_OUT).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

readonly BASE_TAG=pristine
readonly BINARIES=(virt-operator virt-api virt-controller virt-handler virt-launcher virtctl
	virt-chroot virt-launcher-monitor virt-probe virt-tail virt-freezer)
# Fixed identity and dates keep the baseline commit id the same everywhere.
readonly GIT_IDENTITY=(-c user.name="kubevirt-qcow2" -c user.email="kubevirt-qcow2@users.noreply.github.com")

tree_git() { git -C "${KUBEVIRT_TREE}" "${GIT_IDENTITY[@]}" "$@"; }

module_dir() {
	local dir
	dir=$(go mod download -json "$1@${KUBEVIRT_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	[[ -d ${dir} ]] || die "cannot download $1@${KUBEVIRT_VERSION} from the module proxy"
	echo "${dir}"
}

assemble() {
	if git -C "${KUBEVIRT_TREE}" rev-parse -q --verify "refs/tags/${BASE_TAG}" >/dev/null 2>&1; then
		return 0
	fi
	log "assembling pristine KubeVirt ${KUBEVIRT_VERSION} in ${KUBEVIRT_TREE}"
	local tmp="${KUBEVIRT_TREE}.tmp"
	rm -rf "${tmp}"
	mkdir -p "${tmp}/staging/src/kubevirt.io"
	cp -r "$(module_dir kubevirt.io/kubevirt)/." "${tmp}/"
	# Nested modules are not part of the module zip; KubeVirt's go.mod and
	# go.work replace them with ./staging.
	cp -r "$(module_dir kubevirt.io/api)" "${tmp}/staging/src/kubevirt.io/api"
	cp -r "$(module_dir kubevirt.io/client-go)" "${tmp}/staging/src/kubevirt.io/client-go"
	chmod -R u+w "${tmp}"
	git -C "${tmp}" init -q -b main
	git -C "${tmp}" add -A -f .
	GIT_AUTHOR_DATE="2000-01-01T00:00:00Z" GIT_COMMITTER_DATE="2000-01-01T00:00:00Z" \
		git -C "${tmp}" "${GIT_IDENTITY[@]}" commit -q -m "KubeVirt ${KUBEVIRT_VERSION} from the Go module proxy"
	git -C "${tmp}" tag "${BASE_TAG}"
	rm -rf "${KUBEVIRT_TREE}" "${KUBEVIRT_TREE}-pristine" "${KUBEVIRT_TREE}.gowork" "${KUBEVIRT_TREE}-pristine.gowork"
	mv "${tmp}" "${KUBEVIRT_TREE}"
}

series() {
	local file="${KUBEVIRT_PATCHES}/series"
	[[ -f ${file} ]] || return 0
	grep -v -e '^\s*#' -e '^\s*$' "${file}"
}

apply() {
	assemble
	log "applying ${KUBEVIRT_PATCHES}/series onto ${BASE_TAG}"
	tree_git am --abort >/dev/null 2>&1 || true
	tree_git checkout -q -f main
	tree_git reset -q --hard "${BASE_TAG}"
	tree_git clean -q -fdx
	local patch count=0
	while read -r patch; do
		if ! tree_git am -q --keep-cr "${KUBEVIRT_PATCHES}/${patch}" 2>"${KUBEVIRT_TREE}/.git/am-error"; then
			log "patch ${patch} does not apply; the tree is left mid-am for inspection:"
			cat "${KUBEVIRT_TREE}/.git/am-error" >&2
			log "failing hunks: git -C ${KUBEVIRT_TREE} am --show-current-patch=diff"
			exit 1
		fi
		count=$((count + 1))
	done < <(series)
	log "applied ${count} patches"
}

# Stable output: no commit ids, no numbering that shifts when a patch is
# added, no git version signature, full blob ids.
export_patches() {
	[[ -d ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run assemble"
	mkdir -p "${KUBEVIRT_PATCHES}"
	local tmp
	tmp=$(mktemp -d)
	tree_git format-patch -q --zero-commit --no-signature --full-index --no-numbered \
		--no-renames -o "${tmp}" "${BASE_TAG}..HEAD" >/dev/null
	find "${KUBEVIRT_PATCHES}" -maxdepth 1 -name '*.patch' -delete
	local patch names=()
	for patch in "${tmp}"/*.patch; do
		[[ -e ${patch} ]] || continue
		mv "${patch}" "${KUBEVIRT_PATCHES}/"
		names+=("$(basename "${patch}")")
	done
	rm -rf "${tmp}"
	{
		echo "# Patches against KubeVirt ${KUBEVIRT_VERSION}, applied in this order by hack/kubevirt.sh apply."
		if [[ ${#names[@]} -gt 0 ]]; then printf '%s\n' "${names[@]}"; fi
	} >"${KUBEVIRT_PATCHES}/series"
	log "exported ${#names[@]} patches to ${KUBEVIRT_PATCHES}"
}

build() {
	[[ -d ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run apply"
	local bin=("$@")
	[[ ${#bin[@]} -gt 0 ]] || bin=("${BINARIES[@]}")
	mkdir -p "${KUBEVIRT_OUT}/bin"
	local name
	for name in "${bin[@]}"; do
		log "building ${name}"
		tree_go "${KUBEVIRT_TREE}" . build -trimpath -o "${KUBEVIRT_OUT}/bin/${name}" "./cmd/${name}"
	done
}

# touched_packages TREE RANGE: Go packages (as directories relative to the
# tree) whose files the commits of RANGE change, test data included: a
# changed file counts for the nearest directory above it that holds Go
# files in TREE (the tree's root excepted).
touched_packages() {
	local tree=$1 range=$2
	git -C "${tree}" diff --name-only "${range}" |
		while read -r file; do
			local dir
			dir=$(dirname "${file}")
			while [[ ${dir} != . ]] && ! compgen -G "${tree}/${dir}/*.go" >/dev/null; do
				dir=$(dirname "${dir}")
			done
			[[ ${dir} != . ]] && echo "${dir}"
		done | sort -u
}

# Runs the unit tests of dirs (relative to a tree; staging dirs resolve to
# their own module through go.work) and leaves one `go test -json` stream per
# package in $2, plus a Ginkgo JSON report where the package is a Ginkgo suite.
# With a cache directory $3, a package's results found there are taken from
# it, and those run are kept there.
run_unit_tests() {
	local tree=$1 out=$2 cache=$3 dir name args
	shift 3
	rm -rf "${out}"
	mkdir -p "${out}"
	for dir in "$@"; do
		[[ -d ${tree}/${dir} ]] || continue
		name=${dir//\//_}
		# The stream is kept last: it marks the package's results complete.
		if [[ -n ${cache} && -f ${cache}/${name}.json ]]; then
			cp "${cache}/${name}".* "${out}/"
			continue
		fi
		args=()
		if grep -qs 'github.com/onsi/ginkgo/v2' "${tree}/${dir}"/*_test.go; then
			args=(-args "-ginkgo.json-report=${out}/${name}.ginkgo.json")
		fi
		tree_go "${tree}" "${dir}" test -json -count=1 . "${args[@]}" >"${out}/${name}.json" 2>&1 || true
		if [[ -n ${cache} ]]; then
			mkdir -p "${cache}"
			[[ ! -f ${out}/${name}.ginkgo.json ]] || cp "${out}/${name}.ginkgo.json" "${cache}/"
			cp "${out}/${name}.json" "${cache}/${name}.json.new"
			mv "${cache}/${name}.json.new" "${cache}/${name}.json"
		fi
	done
}

# results_cache REVISION LABEL is where the test results of the tree at
# REVISION are kept: they depend only on that tree, the Go toolchain, the
# machine and the build root, so each package runs once per tree, not in
# every `make test`: the pristine tree's once per release, the patched
# tree's once per state of the series.
results_cache() {
	local key
	key=$({
		tree_git rev-parse "$1^{tree}"
		go version
		uname -srm
		[[ -z ${KUBEVIRT_BUILD_ROOT} ]] || basename "$("${QCOW2_ROOT}/hack/buildroot.sh" path)"
	} | sha256sum | cut -c1-16)
	echo "${QCOW2_CACHE}/kubevirt-tests/${KUBEVIRT_VERSION}-$2-${key}"
}

test_upstream() {
	[[ -d ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run apply"
	local dirs
	# The packages the series touches, and where the build root provides
	# libnbd those that import its bindings: KubeVirt's NBD client's tests
	# run against the real library.
	mapfile -t dirs < <({
		touched_packages "${KUBEVIRT_TREE}" "${BASE_TAG}..HEAD"
		[[ -z ${KUBEVIRT_BUILD_ROOT} ]] ||
			git -C "${KUBEVIRT_TREE}" grep -l '"libguestfs.org/libnbd"' -- '*.go' | xargs -r -n1 dirname
	} | sort -u)
	if [[ ${#dirs[@]} -eq 0 ]]; then
		log "the series touches no Go package: nothing to compare"
		return 0
	fi
	local pristine
	pristine=$(worktree pristine "${BASE_TAG}")
	local reports="${KUBEVIRT_OUT}/upstream-tests"
	mkdir -p "${reports}"
	log "KubeVirt unit tests of ${#dirs[@]} packages: ${dirs[*]}"
	run_unit_tests "${pristine}" "${reports}/pristine" "$(results_cache "${BASE_TAG}" pristine)" "${dirs[@]}"
	# The patched tree's results are kept only for a committed tree: work in
	# progress runs every time.
	local patched=
	[[ -n $(tree_git status --porcelain) ]] || patched=$(results_cache HEAD patched)
	run_unit_tests "${KUBEVIRT_TREE}" "${reports}/patched" "${patched}" "${dirs[@]}"
	(cd "${QCOW2_ROOT}" && go run ./hack/testdiff "${reports}/pristine" "${reports}/patched")
}

# worktree NAME REVISION: the path of a worktree of the tree beside it,
# TREE-NAME, made at REVISION when missing.
worktree() {
	local path="${KUBEVIRT_TREE}-$1"
	if [[ ! -d ${path} ]]; then
		tree_git worktree prune
		tree_git worktree add -q --detach "${path}" "$2"
	fi
	echo "${path}"
}

# check_commits [REVISION [LAST]]: each commit after REVISION (the baseline
# by default) up to LAST (the tree's HEAD by default), in turn, in a worktree beside the tree:
# the binaries build, and the unit tests of the packages the commit
# changes keep what pristine KubeVirt passes. A series has to work at
# every commit, not only at its end. With KUBEVIRT_CHECK_COMPILE_ONLY=1
# the tests are compiled and vetted, not run (minutes instead of hours for
# a whole series).
check_commits() {
	[[ -d ${KUBEVIRT_TREE}/.git ]] || die "no tree at ${KUBEVIRT_TREE}: run apply"
	local since=${1:-${BASE_TAG}} last=${2:-HEAD} check pristine commit dirs name
	check=$(worktree check HEAD)
	pristine=$(worktree pristine "${BASE_TAG}")
	local reports="${KUBEVIRT_OUT}/commit-tests" commits=()
	mapfile -t commits < <(tree_git rev-list --reverse "${since}..${last}")
	for commit in "${commits[@]}"; do
		git -C "${check}" checkout -q --detach "${commit}"
		log "checking $(git -C "${check}" log -1 --format='%h %s')"
		local packages=()
		for name in "${BINARIES[@]}"; do packages+=("./cmd/${name}"); done
		tree_go "${check}" . build ./pkg/... "${packages[@]}" || die "commit ${commit} does not build"
		mapfile -t dirs < <(touched_packages "${check}" "${commit}^..${commit}")
		[[ ${#dirs[@]} -gt 0 ]] || continue
		if [[ ${KUBEVIRT_CHECK_COMPILE_ONLY:-} == 1 ]]; then
			tree_go "${check}" . test -count=1 -run '^$' "${dirs[@]/#/./}" >/dev/null ||
				die "the tests of commit ${commit} do not compile"
			continue
		fi
		run_unit_tests "${pristine}" "${reports}/pristine" "$(results_cache "${BASE_TAG}" pristine)" "${dirs[@]}"
		run_unit_tests "${check}" "${reports}/patched" "" "${dirs[@]}"
		(cd "${QCOW2_ROOT}" && go run ./hack/testdiff "${reports}/pristine" "${reports}/patched") ||
			die "commit ${commit} fails unit tests pristine KubeVirt passes, or its own"
	done
	log "checked ${#commits[@]} commits"
}

usage() {
	echo "usage: [KUBEVIRT_VERSION=v1.8.3|v1.7.0] $0 assemble|apply|export|build [binary...]|test|check [revision [last]]" >&2
	exit 2
}

main() {
	[[ $# -ge 1 ]] || usage
	local cmd=$1
	shift
	case "${cmd}" in
	assemble) assemble ;;
	apply) apply ;;
	export) export_patches ;;
	build) build "$@" ;;
	test) test_upstream ;;
	check) check_commits "$@" ;;
	*) usage ;;
	esac
}

main "$@"
