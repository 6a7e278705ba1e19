// Package overlay_test is the functional suite of overlay volumes on the
// virt-launcher side: the patched KubeVirt tree's converter turns a VMI with
// an overlay volume into a domain, its overlay creator makes or validates the
// overlay, and the domain boots under a private libvirtd with the test guest.
package overlay_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestOverlay(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "overlay volumes functional Suite")
}

// vmi2domain is the tool built inside the patched tree for the suite.
var vmi2domain framework.VMI2Domain

var _ = BeforeSuite(func(ctx SpecContext) {
	_, err := os.Stat(filepath.Join(framework.KubeVirtTree(), "pkg", "storage", "overlay", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")

	dir, err := os.MkdirTemp("", "overlay-vmi2domain-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	vmi2domain, err = framework.BuildVMI2Domain(ctx, dir)
	Expect(err).ToNot(HaveOccurred())
}, NodeTimeout(15*time.Minute))
