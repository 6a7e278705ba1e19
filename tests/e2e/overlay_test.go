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

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Where virt-launcher's compute container keeps an ephemeral overlay.
var ephemeralOverlay = testenv.OverlayEphemeralImage("rootdisk")

// allocatedInTop is how many bytes of data the top image of a chain
// holds, read with qemu-img inside the launcher pod while QEMU runs (-U:
// QEMU holds the lock).
func allocatedInTop(ctx context.Context, pod, image string) int64 {
	out, err := kubectl(ctx, "-n", namespace, "exec", pod, "-c", "compute", "--",
		"qemu-img", "map", "-U", "--output=json", image)
	Expect(err).ToNot(HaveOccurred())
	var extents []struct {
		Length int64
		Depth  int
		Data   bool
	}
	Expect(json.Unmarshal([]byte(out), &extents)).To(Succeed())
	var n int64
	for _, e := range extents {
		if e.Depth == 0 && e.Data {
			n += e.Length
		}
	}
	return n
}

// publishedBytes is what the Linux guest's pieces hold, at the size
// hack/guest/guest-test writes by default.
func publishedBytes(status testenv.LinuxGuestStatus) int64 {
	return int64(len(status.Published)) * 256 << 10
}

// waitSyncRefused waits until the VM's VMI is not synchronized, saying
// message: virt-launcher refused its overlay before the domain started.
func waitSyncRefused(ctx context.Context, vm, message string) {
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
			`jsonpath={.status.conditions[?(@.type=="Synchronized")].message}`)
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(out).To(ContainSubstring(message))
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
}

// growImage grows a golden image behind its claim's back; the refusal
// names the size the overlay was made over.
func growImage(_ context.Context, _, image string) string {
	size := fileSize(image)
	Expect(os.Truncate(image, size+1<<20)).To(Succeed())
	return fmt.Sprintf("size %d", size)
}

// recreateClaim deletes a golden claim and its volume and makes them again
// over the same directory: the same bytes, another claim.
func recreateClaim(ctx context.Context, claim, image string) string {
	Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", claim, "--wait=true")).Error().ToNot(HaveOccurred())
	Expect(kubectl(ctx, "delete", "pv", claim, "--wait=true")).Error().ToNot(HaveOccurred())
	localClaim(ctx, claim, filepath.Dir(image), "Filesystem", "ReadOnlyMany", fileSize(image))
	return "claim UID"
}

func podUID(ctx context.Context, pod string) string {
	uid, err := kubectl(ctx, "-n", namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
	Expect(err).ToNot(HaveOccurred())
	return uid
}

// nodeLeftovers lists what the node still holds of a pod: its directory and
// mounts.
func nodeLeftovers(ctx context.Context, node, uid string) string {
	out, _ := inNode(ctx, "--node", node, "sh", "-c", fmt.Sprintf(
		"ls -d /var/lib/kubelet/pods/%[1]s 2>/dev/null; grep -F %[1]s /proc/self/mountinfo || true", uid))
	return strings.TrimSpace(out)
}

var _ = Describe("overlay volumes through the API", Ordered, Label(linuxGuestLabel), func() {
	var golden, goldenSHA string
	var goldenBytes int64

	BeforeAll(func(ctx SpecContext) {
		golden = linuxGolden(ctx, "golden-fs")
		goldenBytes = fileSize(golden)
		var err error
		goldenSHA, err = testenv.SHA256(golden)
		Expect(err).ToNot(HaveOccurred())
	})

	ephemeral := `
overlay:
  backingPVC: {claimName: golden-fs}
  backingFormat: raw`

	It("boots two VMs from ephemeral overlays over one golden claim, each writing only its own overlay", func(ctx SpecContext) {
		vms := []string{"ephemeral-a", "ephemeral-b"}
		for _, vm := range vms {
			Expect(apply(ctx, linuxVMYAML(vm, "Always", "", ephemeral))).To(Succeed())
		}
		uids := map[string]string{}
		for _, vm := range vms {
			waitVMIReady(ctx, vm)
			status := waitLinuxDone(ctx, vm)
			Expect(status.Boot).To(Equal(1), "the overlay starts from the golden image")
			Expect(status.Published).To(HaveLen(4))
			pod := launcherPod(ctx, vm)
			uids[vm] = podUID(ctx, pod)
			// KubeVirt's default: the launcher runs as qemu (107), and the
			// overlay it made is its own.
			Expect(kubectl(ctx, "-n", namespace, "exec", pod, "-c", "compute", "--", "id", "-u")).To(Equal("107"))
			Expect(kubectl(ctx, "-n", namespace, "exec", pod, "-c", "compute", "--", "stat", "-c", "%u", ephemeralOverlay)).To(Equal("107"))
			// What the guest wrote is in its own overlay.
			Expect(allocatedInTop(ctx, pod, ephemeralOverlay)).To(BeNumerically(">=", publishedBytes(status)))
		}
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image changed")

		for _, vm := range vms {
			deleteVM(ctx, vm)
			Eventually(func() string { return nodeLeftovers(ctx, nodeName, uids[vm]) }).
				WithContext(ctx).WithTimeout(2*time.Minute).Should(BeEmpty(), "the node still holds %s's pod", vm)
		}
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
	})

	persistent := func(target string) string {
		return fmt.Sprintf(`
overlay:
  backingPVC: {claimName: golden-fs}
  backingFormat: raw
  persistent: true
  targetPVC: {claimName: %s}`, target)
	}

	fsTarget := func(ctx context.Context, name string) string {
		return filepath.Join(emptyFilesystemClaim(ctx, name, goldenBytes*2), "disk.qcow2")
	}
	blockTarget := func(ctx context.Context, name string) string {
		return blockClaim(ctx, name, goldenBytes+16<<20)
	}

	// The second boot reads back the first one's pieces and adds its own:
	// it ran on the first one's overlay.
	DescribeTable("a persistent overlay keeps the guest's data across stop and start",
		func(ctx SpecContext, vm string, targetOf func(ctx context.Context, name string) string) {
			target := targetOf(ctx, vm+"-target")
			Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=4", persistent(vm+"-target")))).To(Succeed())
			waitVMIReady(ctx, vm)
			first := waitLinuxDone(ctx, vm)
			Expect(first.Boot).To(Equal(1))
			Expect(first.Published).To(HaveLen(4))
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			Expect(checkImage(ctx, target).Clean()).To(BeTrue(), "qemu-img check of the overlay after a clean stop")

			setGuestOrders(ctx, vm, "pieces=2")
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIReady(ctx, vm)
			second := waitLinuxDone(ctx, vm)
			Expect(second.Boot).To(Equal(2))
			Expect(second.Listed).To(Equal(4), "the first boot's pieces, read back")
			Expect(second.Published).To(HaveLen(2))
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			Expect(checkImage(ctx, target).Clean()).To(BeTrue())
			Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
			deleteVM(ctx, vm)
		},
		Entry("on a Filesystem target claim", "persistent-fs", fsTarget, SpecTimeout(15*time.Minute)),
		Entry("on a Block-mode target claim", "persistent-block", blockTarget, SpecTimeout(15*time.Minute)),
	)

	DescribeTable("refuses to start on a changed backing, says why, and leaves the overlay alone",
		func(ctx SpecContext, vm string, targetOf func(ctx context.Context, name string) string, change func(ctx context.Context, claim, image string) string) {
			image := linuxGolden(ctx, vm+"-golden")
			target := targetOf(ctx, vm+"-target")
			source := fmt.Sprintf(`
overlay:
  backingPVC: {claimName: %s-golden}
  backingFormat: raw
  persistent: true
  targetPVC: {claimName: %s-target}`, vm, vm)
			Expect(apply(ctx, linuxVMYAML(vm, "Always", "", source))).To(Succeed())
			waitVMIReady(ctx, vm)
			waitLinuxDone(ctx, vm)
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			overlaySHA, err := testenv.SHA256(target)
			Expect(err).ToNot(HaveOccurred())

			message := change(ctx, vm+"-golden", image)
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitSyncRefused(ctx, vm, "changed since the overlay was created")
			waitSyncRefused(ctx, vm, message)
			Expect(testenv.SHA256(target)).To(Equal(overlaySHA), "the overlay was touched")
			deleteVM(ctx, vm)
			Expect(testenv.SHA256(target)).To(Equal(overlaySHA))
		},
		Entry("grown behind the overlay's back, on a Filesystem target claim", "changed-fs", fsTarget, growImage, SpecTimeout(15*time.Minute)),
		Entry("grown behind the overlay's back, on a Block-mode target claim", "changed-block", blockTarget, growImage, SpecTimeout(15*time.Minute)),
		Entry("the same image on a claim created again", "recreated", blockTarget, recreateClaim, SpecTimeout(15*time.Minute)),
	)

	It("gives a persistent overlay to its VM alone: a copy of the VM waits, then is refused, and a VM created again takes it only when told", func(ctx SpecContext) {
		const vm, copied = "owned", "owned-copy"
		createTenant(ctx)
		// ReadWriteMany, as a shared Block volume would be: nothing in the
		// claim's access mode keeps a second VMI away.
		dev := blockClaimWithAccess(ctx, "owned-target", goldenBytes+16<<20, "ReadWriteMany")
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "", persistent("owned-target")))).To(Succeed())
		waitVMIReady(ctx, vm)
		first := waitLinuxDone(ctx, vm)

		By("a copy of the VM, made by the namespace's VM author, waits while the VM runs")
		Expect(kubectlIn(ctx, linuxVMYAML(copied, "Always", "", persistent("owned-target")), asTenant, "create", "-f", "-")).Error().ToNot(HaveOccurred())
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "-n", namespace, "get", "events", "--field-selector",
				"involvedObject.kind=VirtualMachineInstance,involvedObject.name="+copied+",reason=OverlayTargetInUse", "-o", "jsonpath={.items[*].message}")
			g.Expect(err).ToNot(HaveOccurred())
			g.Expect(out).To(ContainSubstring("claim owned-target, the target of overlay volume rootdisk, is in use by VMI " + vm))
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		Expect(kubectl(ctx, "-n", namespace, "get", "pods", "-l", "vm.kubevirt.io/name="+copied, "-o", "name")).To(BeEmpty())

		By("once the VM stops, the copy starts and its virt-launcher refuses the overlay, leaving it alone")
		owner, err := kubectl(ctx, "-n", namespace, "get", "vm", vm, "-o", "jsonpath={.metadata.uid}")
		Expect(err).ToNot(HaveOccurred())
		Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
		waitVMIGone(ctx, vm)
		overlaySHA, err := testenv.SHA256(dev)
		Expect(err).ToNot(HaveOccurred())
		waitSyncRefused(ctx, copied, "belongs to VirtualMachine "+namespace+"/"+vm+" (UID "+owner+")")
		deleteVM(ctx, copied)
		Expect(testenv.SHA256(dev)).To(Equal(overlaySHA), "the overlay was touched")

		By("the VM created again under its name is refused until its template names the old owner")
		deleteVM(ctx, vm)
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "", persistent("owned-target")))).To(Succeed())
		waitSyncRefused(ctx, vm, "set the VMI's annotation kubevirt.io/overlay-adopt-owner-uid to "+owner)
		Expect(testenv.SHA256(dev)).To(Equal(overlaySHA))
		deleteVM(ctx, vm)
		Expect(apply(ctx, strings.Replace(linuxVMYAML(vm, "Always", "pieces=0", persistent("owned-target")), "  template:\n",
			"  template:\n    metadata: {annotations: {kubevirt.io/overlay-adopt-owner-uid: "+owner+"}}\n", 1))).To(Succeed())
		waitVMIReady(ctx, vm)
		adopted := waitLinuxDone(ctx, vm)
		Expect(adopted.Boot).To(Equal(2))
		Expect(adopted.Listed).To(Equal(len(first.Published)), "the first VM's pieces, read back")
		deleteVM(ctx, vm)
	}, SpecTimeout(20*time.Minute))

	It("boots a VM from an ephemeral overlay over a Block-mode golden claim", func(ctx SpecContext) {
		vm := "block-golden"
		dev := blockClaim(ctx, vm, goldenBytes)
		Expect(exec.CommandContext(ctx, "dd", "if="+golden, "of="+dev, "bs=1M", "conv=fsync", "status=none").Run()).To(Succeed())
		before, err := testenv.SHA256(dev)
		Expect(err).ToNot(HaveOccurred())
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "", `
overlay:
  backingPVC: {claimName: block-golden}
  backingFormat: raw`))).To(Succeed())
		waitVMIReady(ctx, vm)
		status := waitLinuxDone(ctx, vm)
		Expect(status.Boot).To(Equal(1))
		Expect(allocatedInTop(ctx, launcherPod(ctx, vm), ephemeralOverlay)).To(BeNumerically(">=", publishedBytes(status)))
		deleteVM(ctx, vm)
		Expect(testenv.SHA256(dev)).To(Equal(before), "the golden device changed")
	}, SpecTimeout(10*time.Minute))

	DescribeTable("the running virt-api refuses bad overlays, naming the field",
		func(ctx SpecContext, overlay, field, message string) {
			_, err := kubectlIn(ctx, vmYAML("refused", "Halted", overlay), "create", "--dry-run=server", "-f", "-")
			Expect(err).To(MatchError(And(ContainSubstring(field), ContainSubstring(message))))
		},
		Entry("no backing", "overlay: {backingFormat: raw}",
			"spec.template.spec.volumes[0].overlay", "must have one of backingPVC or backingHostPath set"),
		Entry("persistent without a target", "overlay: {backingPVC: {claimName: golden-fs}, persistent: true}",
			"spec.template.spec.volumes[0].overlay.persistent", "requires targetPVC or targetHostPath"),
		Entry("an unknown backingFormat", "overlay: {backingPVC: {claimName: golden-fs}, backingFormat: vmdk}",
			"spec.template.spec.volumes[0].overlay.backingFormat", `Unsupported value: "vmdk": supported values: "raw", "qcow2"`),
		Entry("a host path the cluster does not allow", "overlay: {backingHostPath: {path: /etc/shadow}}",
			"spec.template.spec.volumes[0].overlay.backingHostPath", "is not below a directory the cluster allows for golden images"),
	)

	It("refuses overlays while the OverlayVolumes gate is off", func(ctx SpecContext) {
		gates, err := kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o",
			"jsonpath={.spec.configuration.developerConfiguration.featureGates}")
		Expect(err).ToNot(HaveOccurred())
		setGates := func(ctx context.Context, g string) {
			_, err := kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "merge", "-p",
				`{"spec":{"configuration":{"developerConfiguration":{"featureGates":`+g+`}}}}`)
			Expect(err).ToNot(HaveOccurred())
		}
		DeferCleanup(func(ctx SpecContext) {
			setGates(ctx, gates)
			Eventually(func() error {
				_, err := kubectlIn(ctx, vmYAML("accepted", "Halted", ephemeral), "create", "--dry-run=server", "-f", "-")
				return err
			}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
		})
		setGates(ctx, strings.ReplaceAll(gates, `"OverlayVolumes",`, ""))
		Eventually(func() error {
			_, err := kubectlIn(ctx, vmYAML("refused", "Halted", ephemeral), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(MatchError(ContainSubstring("OverlayVolumes")))
	}, SpecTimeout(5*time.Minute))

	It("keeps a VM running while virt-handler's pod is replaced, and stops it cleanly after", func(ctx SpecContext) {
		vm := "handler-restart"
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "", ephemeral))).To(Succeed())
		waitVMIReady(ctx, vm)
		waitLinuxDone(ctx, vm)
		pod := launcherPod(ctx, vm)
		uid := podUID(ctx, pod)

		Expect(kubectl(ctx, "-n", "kubevirt", "delete", "pod", "-l", "kubevirt.io=virt-handler", "--wait=true")).Error().ToNot(HaveOccurred())
		Expect(kubectl(ctx, "-n", "kubevirt", "rollout", "status", "daemonset/virt-handler", "--timeout=5m")).Error().ToNot(HaveOccurred())
		Consistently(func(g Gomega) {
			out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", "jsonpath={.status.phase}")
			g.Expect(err).ToNot(HaveOccurred())
			g.Expect(out).To(Equal("Running"))
		}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(3 * time.Second).Should(Succeed())
		Expect(launcherPod(ctx, vm)).To(Equal(pod), "the VM's pod was replaced")

		deleteVM(ctx, vm)
		Eventually(func() string { return nodeLeftovers(ctx, nodeName, uid) }).
			WithContext(ctx).WithTimeout(2 * time.Minute).Should(BeEmpty())
	}, SpecTimeout(15*time.Minute))
})
