// Package env_test proves the shared functional-test framework against real
// parts: a private libvirtd, QEMU, the boot-sector guest, qcow2 overlays and
// loop devices.
package env_test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestEnv(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Real test environment")
}

// daemon is the suite's private libvirtd.
var daemon *framework.Libvirtd

var _ = BeforeSuite(func(ctx SpecContext) {
	d, err := framework.StartLibvirtd(ctx)
	framework.Require(err, "private libvirtd")
	daemon = d
	DeferCleanup(daemon.Stop, NodeTimeout(time.Minute))
	GinkgoWriter.Printf("private libvirtd at %s, guests use %s\n", daemon.URI(), daemon.VirtType())
}, NodeTimeout(3*time.Minute))
