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

.PHONY: all deps build go-build kubevirt test test-unit test-functional test-upstream bench clean

all: deps build

deps:
	hack/install-deps.sh
	hack/envtest-assets.sh >/dev/null

build: $(BIN)/container-disk go-build kubevirt

go-build:
	$(GO) build ./...

$(BIN)/container-disk: $(wildcard containerdisk/*.c containerdisk/*.h)
	@mkdir -p $(BIN)
	$(MUSL_CC) -std=c11 -Os -Wall -Wextra -Werror -static -s -o $@ $(filter %.c,$^)

# The patched KubeVirt tree and its binaries.
kubevirt:
	hack/kubevirt.sh apply
	hack/kubevirt.sh build

test: build test-unit test-functional test-upstream

# Fast tests with no root infrastructure.
test-unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v '/tests/')

# Ginkgo suites under tests/ that start their own libvirtd, envtest, S3 and
# loop devices; CI=true turns any skip into a failure.
test-functional: $(BIN)/container-disk
	KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh) \
		$(GO) test -count=1 -p 1 -timeout $(FUNCTIONAL_TIMEOUT) -v ./tests/...

# KubeVirt's own unit tests in every package the series touches, patched
# against pristine.
test-upstream:
	hack/kubevirt.sh test

bench:
	@echo "no benchmarks yet"

clean:
	rm -rf $(OUT) _build
