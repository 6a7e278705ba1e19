/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Package env_test proves the shared functional-test framework against real
// parts: a private libvirtd, QEMU, the boot-sector guest, qcow2 overlays and
// loop devices.
package env_test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestEnv(t *testing.T) {
	framework.RunSuite(t, "Real test environment")
}

// daemon is the suite's private libvirtd.
var daemon *testenv.Libvirtd

var _ = BeforeSuite(func(ctx SpecContext) {
	d, err := testenv.StartLibvirtd(ctx)
	framework.Require(err, "private libvirtd")
	daemon = d
	DeferCleanup(daemon.Stop, NodeTimeout(time.Minute))
	GinkgoWriter.Printf("private libvirtd at %s, guests use %s\n", daemon.URI(), daemon.VirtType())
}, NodeTimeout(3*time.Minute))
