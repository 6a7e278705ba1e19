// Package overlay_test is the functional suite of overlay volumes on the
// virt-launcher side: the patched KubeVirt tree's converter turns a VMI with
// an overlay volume into a domain, its overlay creator makes or validates the
// overlay, and the domain boots under a private libvirtd with the test guest.
package overlay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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

const kubeVirtTreeEnv = "KUBEVIRT_TREE"

// vmi2domain is the tool built inside the patched tree for the suite.
var vmi2domain string

var _ = BeforeSuite(func(ctx SpecContext) {
	tree := os.Getenv(kubeVirtTreeEnv)
	if tree == "" {
		tree = filepath.Join(framework.RepoRoot(), "_build", "kubevirt-v1.7.0")
	}
	_, err := os.Stat(filepath.Join(tree, "pkg", "storage", "overlay", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")

	dir, err := os.MkdirTemp("", "overlay-vmi2domain-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	vmi2domain = filepath.Join(dir, "vmi2domain")
	Expect(buildInTree(ctx, tree, vmi2domain)).To(Succeed())
}, NodeTimeout(15*time.Minute))

// buildInTree builds the tool as a package of the tree without writing into
// it: `go build -overlay` places the source file at a path of the tree.
func buildInTree(ctx context.Context, tree, out string) error {
	source := filepath.Join(framework.RepoRoot(), "tests", "overlay", "testdata", "vmi2domain", "main.go")
	absTree, err := filepath.Abs(tree)
	if err != nil {
		return err
	}
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(absTree, "cmd", "overlay-vmi2domain", "main.go"): source},
	})
	if err != nil {
		return err
	}
	overlayFile := filepath.Join(filepath.Dir(out), "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-overlay", overlayFile, "-o", out, "./cmd/overlay-vmi2domain")
	cmd.Dir = absTree
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("build vmi2domain in %s: %w: %s", absTree, err, output)
	}
	return nil
}
