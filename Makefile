# kubevirt-qcow2: `make` installs what is missing and builds everything;
# `make test` runs every test. See README.md.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
GO ?= go
# The container-disk program is linked statically against musl: ~50 KB.
MUSL_CC ?= musl-gcc
OUT := _out
BIN := $(OUT)/bin
# Functional suites share one machine's libvirt, loop devices and mounts.
FUNCTIONAL_TIMEOUT ?= 60m
# Domain type for functional tests: empty uses KVM when /dev/kvm works, else
# TCG. On nested hosts whose KVM traps every port I/O (kvm-pvm), the BIOS
# guest boots and writes about ten times faster under TCG: set "qemu" there.
FUNCTIONAL_VIRT_TYPE ?=

.PHONY: all deps build go-build images images-stock images-velero kubevirt test lint test-unit test-functional e2e e2e-images e2e-one-node e2e-upgrade e2e-two-nodes e2e-velero test-upstream bench bench-backup bench-thinp bench-hooks bench-overlay bench-hotplug bench-e2e bench-migration clean

all: deps build

deps:
	hack/install-deps.sh
	hack/kubernetes.sh >/dev/null
	hack/envtest-assets.sh >/dev/null
	hack/s3-server.sh >/dev/null
	hack/golangci-lint.sh >/dev/null
	hack/csi-sidecars.sh >/dev/null
	hack/velero.sh >/dev/null

build: $(BIN)/container-disk go-build kubevirt

# Our binaries: commands, and the hook sidecar as a static binary (its
# image holds nothing else). Packages no command imports are compiled by
# lint's go vet: a build of ./... links every main package again each time.
go-build:
	$(GO) build -trimpath -o $(BIN)/ ./cmd/...
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w -buildid=' -o $(BIN)/overlay-hook ./hooks/overlay

# OCI image layouts under _out/images, built without a container engine;
# the same inputs give the same digests, and an image whose inputs did not
# change is not written again (cmd/oci-image). Ours are from scratch: the hook,
# the datamover controller's, pods' and Velero plugin's images
# (hack/datamover-images.sh: non-root, the first two with the machine's CA
# bundle, the pods' with qemu-img and the libraries it loads on this
# machine), and deploy/csi-loop's CSI driver with the external-provisioner
# and external-resizer sidecars built from the Go module proxy
# (hack/csi-images.sh; docker archives beside them for hack/cluster.sh
# import). The patched KubeVirt
# components are the upstream images with our binaries on top, at
# upstream's paths and modes; their bases come from KUBEVIRT_BASE:
# "registry" (quay.io/kubevirt/<component>:$(KUBEVIRT_VERSION)), or a directory holding
# an OCI layout <component>/ or a docker archive <component>.tar each.
# Without it they are built on a base made here from Debian's packages,
# with virt-operator and its manifest (hack/kubevirt-images.sh): what the
# one-node cluster runs. Push: docs/install.md.
IMAGE_REGISTRY ?= kubevirt-qcow2
IMAGE_TAG ?= dev
KUBEVIRT_BASE ?=
# The KubeVirt release the series is built on, and run (hack/common.sh).
KUBEVIRT_VERSION ?= v1.8.3
export KUBEVIRT_VERSION
KUBEVIRT_OUT ?= $(OUT)/kubevirt-$(KUBEVIRT_VERSION)
KUBEVIRT_COMPONENTS := virt-operator virt-api virt-controller virt-handler virt-launcher
images: go-build $(BIN)/container-disk
	$(BIN)/oci-image --out $(OUT)/images/overlay-hook --ref $(IMAGE_REGISTRY)/overlay-hook:$(IMAGE_TAG) \
		--file $(BIN)/overlay-hook:/usr/bin/overlay-hook:0755 --entrypoint /usr/bin/overlay-hook
	hack/datamover-images.sh $(OUT) $(IMAGE_REGISTRY) $(IMAGE_TAG)
	hack/csi-images.sh $(OUT) $(IMAGE_REGISTRY) $(IMAGE_TAG)
	@if [[ -z "$(KUBEVIRT_BASE)" ]]; then \
		IMAGE_REGISTRY=$(IMAGE_REGISTRY) IMAGE_TAG=$(IMAGE_TAG) hack/kubevirt-images.sh; exit 0; \
	fi; \
	for c in $(KUBEVIRT_COMPONENTS); do \
		[[ -x $(KUBEVIRT_OUT)/bin/$$c ]] || { echo "images: no $(KUBEVIRT_OUT)/bin/$$c: run make kubevirt"; exit 1; }; \
		case "$(KUBEVIRT_BASE)" in \
		registry) base=quay.io/kubevirt/$$c:$(KUBEVIRT_VERSION) ;; \
		*) base=docker-archive:$(KUBEVIRT_BASE)/$$c.tar; [[ ! -d $(KUBEVIRT_BASE)/$$c ]] || base=oci:$(KUBEVIRT_BASE)/$$c ;; \
		esac; \
		files=(--file $(KUBEVIRT_OUT)/bin/$$c:/usr/bin/$$c:0555:0:0); \
		[[ $$c != virt-launcher ]] || files+=(--file $(BIN)/container-disk:/usr/bin/container-disk:0555:0:0); \
		$(BIN)/oci-image --base "$$base" --out $(OUT)/images/$$c --ref $(IMAGE_REGISTRY)/$$c:$(IMAGE_TAG) "$${files[@]}"; \
	done

# Stock KubeVirt built from the pristine tree the same way, under
# upstream's names, for the upgrade specs of `make e2e`: built once into
# the cache (~/.cache/kubevirt-qcow2/kubevirt-stock-v1.8.3).
images-stock:
	hack/kubevirt-images.sh stock

$(BIN)/container-disk: $(wildcard containerdisk/*.c containerdisk/*.h)
	@mkdir -p $(BIN)
	$(MUSL_CC) -std=c11 -Os -Wall -Wextra -Werror -static -s -o $@ $(filter %.c,$^)

# The patched KubeVirt tree and its binaries.
kubevirt:
	hack/kubevirt.sh apply
	hack/kubevirt.sh build

# Stages in turn, then the end-to-end runs beside the other tests: the
# e2e runs leave about half the CPU idle while their cluster works, and
# the other tests share nothing with the cluster (their own libvirtd,
# envtest, S3 and loop devices). The upgrade specs follow them on a
# cluster of their own, beside the one-node run's. Each stage's time is
# printed at the end (hack/stages.sh; the side chain's output in
# _out/stages).
test:
	hack/stages.sh build lint e2e-images \
		-- e2e-one-node e2e-two-nodes \
		-- test-unit test-functional test-upstream e2e-upgrade

# Formatting, vet, golangci-lint (.golangci.yml; built once into the cache,
# seconds when its cache is warm), shellcheck and licence headers: cheap,
# and first so they fail fast.
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$$(hack/golangci-lint.sh) run ./...
	shellcheck -x hack/*.sh .ci/run
	shellcheck -s sh hack/guest/guest-test hack/guest/initramfs-init
	hack/check-licence.sh

# Fast tests with no root infrastructure, under the race detector: the
# controllers, transfers and monitors run goroutines.
test-unit:
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/tests/')

# Ginkgo suites under tests/ that start their own libvirtd, envtest, S3 and
# loop devices; CI=true turns any skip into a failure.
test-functional: $(BIN)/container-disk
	KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh) FUNCTIONAL_VIRT_TYPE=$(FUNCTIONAL_VIRT_TYPE) \
		$(GO) test -count=1 -p 1 -timeout $(FUNCTIONAL_TIMEOUT) -v $$($(GO) list ./tests/... | grep -v /tests/e2e)

# Velero and its AWS object store plugin, built from the Go module proxy
# into the cache (hack/velero.sh), and their images (hack/velero-images.sh),
# for the e2e specs of a real Velero.
images-velero:
	hack/velero.sh >/dev/null
	hack/velero-images.sh $(OUT) $(IMAGE_REGISTRY)

# The end-to-end suite on a fresh one-node cluster with the patched
# KubeVirt (docs/testing.md), stopped afterwards; artifacts of failed specs
# in _out/e2e-artifacts. A cluster `make cluster` started is replaced. The
# upgrade specs start from stock KubeVirt, the two-node specs on a second
# node: each runs apart, on nodes of its own, so that each run starts one
# cluster.
e2e: e2e-images e2e-one-node e2e-upgrade e2e-two-nodes

e2e-images: images images-stock images-velero

e2e-one-node:
	hack/cluster.sh down
	$(GO) test -count=1 -timeout 75m -v ./tests/e2e -ginkgo.label-filter='!upgrade && !two-nodes'

# Its own cluster directory, host links, cgroups and addresses, so that it
# runs beside the cluster of the other e2e runs.
UPGRADE_CLUSTER := CLUSTER_DIR=$(CURDIR)/$(OUT)/cluster-upgrade CLUSTER_NAME=kvu \
	CLUSTER_NODE_IP=10.98.0.1 CLUSTER_HOST_IP=10.98.0.254

e2e-upgrade:
	$(UPGRADE_CLUSTER) hack/cluster.sh down
	$(UPGRADE_CLUSTER) $(GO) test -count=1 -timeout 40m -v ./tests/e2e -ginkgo.label-filter=upgrade

e2e-two-nodes:
	$(GO) test -count=1 -timeout 40m -v ./tests/e2e -ginkgo.label-filter=two-nodes

# The e2e specs of a real Velero alone.
e2e-velero: images images-velero
	hack/cluster.sh down
	$(GO) test -count=1 -timeout 30m -v ./tests/e2e -ginkgo.label-filter=velero

# KubeVirt's own unit tests in every package the series touches, patched
# against pristine: v1.8.3's tree as `make kubevirt` left it (in the Debian
# 13 build root, hack/buildroot.sh), then v1.7.0's series applied, its
# binaries built and its tests compared (docs/install.md: what v1.7.0
# keeps).
test-upstream:
	hack/kubevirt.sh test
	KUBEVIRT_VERSION=v1.7.0 hack/kubevirt.sh apply
	KUBEVIRT_VERSION=v1.7.0 hack/kubevirt.sh build
	KUBEVIRT_VERSION=v1.7.0 hack/kubevirt.sh test

# Benchmarks compare alternatives side by side in one run and print ratios;
# they need root, like the functional suites, and ~36 GiB free in /tmp
# (the overlay benchmark copies a 16 GiB golden image).
bench: bench-backup bench-thinp bench-hooks bench-overlay bench-hotplug bench-e2e bench-migration

bench-backup:
	$(GO) test -tags bench -count=1 -timeout 40m -run 'TestBackupDataPath|TestSideBySide|TestChild' -v ./tests/backup/bench

bench-thinp:
	$(GO) test -tags bench -count=1 -timeout 40m -v ./tests/thinp/bench

bench-overlay:
	$(GO) test -tags bench -count=1 -timeout 60m -v ./tests/bench/overlay

# Hotplug of a containerDisk on one node, against attaching a plain file.
bench-hotplug: $(BIN)/container-disk
	FUNCTIONAL_VIRT_TYPE=$(FUNCTIONAL_VIRT_TYPE) $(GO) test -tags bench -count=1 -timeout 40m -v ./tests/hotplug/bench

# On the one-node cluster (started if none runs, stopped afterwards): time
# from creating a VM to the guest's first serial line and to its first
# writes, overlay against a plain disk and against copy-then-start; image
# hotplug against claim hotplug; a VM's backup by the kubevirt data mover
# against Velero's file-system backup, full then incremental.
bench-e2e: images images-velero
	$(GO) test -tags bench -count=1 -timeout 70m -v ./tests/e2e -ginkgo.label-filter='bench && !two-nodes'

# Live migration on two nodes (docs/testing.md, "More nodes").
bench-migration: images
	$(GO) test -tags bench -count=1 -timeout 40m -v ./tests/e2e -ginkgo.label-filter='bench && two-nodes'

bench-hooks:
	$(GO) test -tags bench -run '^$$' -bench OnDefineDomain -benchtime 1000x -timeout 30m ./tests/hooks/

# The local demo (docs/demo.md): three VMs from one golden image through
# the patched converter, booted under a private libvirtd, then torn down.
# Needs root and the patched tree `make` builds; output in _out/demo.
.PHONY: demo
demo:
	FUNCTIONAL_VIRT_TYPE=$(FUNCTIONAL_VIRT_TYPE) $(GO) run ./hack/demo -out $(OUT)/demo

.PHONY: cluster cluster-down
# A one-node Kubernetes with the patched KubeVirt on this machine
# (docs/testing.md): needs root and `make` first. NODES=2 adds a worker
# node, for live migration.
NODES ?= 1
cluster: images
	CLUSTER_NODES=$(NODES) hack/cluster.sh up
	hack/cluster.sh kubevirt

cluster-down:
	hack/cluster.sh down

clean:
	rm -rf $(OUT) _build
