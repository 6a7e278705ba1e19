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
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// csiLoopDriver is deploy/csi-loop's driver, on the node as the real
// external-provisioner and external-resizer drive it.
const csiLoopDriver = "loop.csi.kubevirt-qcow2.io"

// deployCSILoop imports the driver's and sidecars' images into the nodes
// and applies deploy/csi-loop as docs/testing.md says, waiting until every
// node's kubelet registered the driver.
func deployCSILoop(ctx context.Context) {
	var archives []string
	for _, image := range []string{"csi-loop", "csi-provisioner", "csi-resizer"} {
		archives = append(archives, filepath.Join(testenv.OutDir(), "images", image+".tar"))
	}
	Expect(run(ctx, clusterScript, append([]string{"import"}, archives...)...)).To(Succeed())
	Expect(kubectl(ctx, "apply", "-k", filepath.Join(testenv.RepoRoot(), "deploy", "csi-loop"))).Error().ToNot(HaveOccurred())
	Expect(kubectl(ctx, "-n", "csi-loop", "rollout", "status", "daemonset/csi-loop", "--timeout=3m")).Error().ToNot(HaveOccurred())
	Eventually(func(g Gomega) {
		for _, node := range clusterNodes() {
			out, err := kubectl(ctx, "get", "csinode", node, "-o", "jsonpath={.spec.drivers[*].name}")
			g.Expect(err).ToNot(HaveOccurred())
			g.Expect(strings.Fields(out)).To(ContainElement(csiLoopDriver), "the kubelet of %s registered the driver", node)
		}
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// csiLoopVolume is the file on this machine that holds a csi-loop claim's
// volume: the driver keeps it in the nodes' /var/lib/csi-loop, the
// cluster's directory hack/cluster.sh shares among them.
func csiLoopVolume(ctx context.Context, claim string) string {
	handle, err := kubectl(ctx, "get", "pv", boundVolume(ctx, claim), "-o", "jsonpath={.spec.csi.volumeHandle}")
	Expect(err).ToNot(HaveOccurred())
	Expect(handle).ToNot(BeEmpty())
	return filepath.Join(clusterDir, "csi-loop", "volumes", handle+".img")
}

// stopThinVM stops the VM and checks, once every node's kubelet unstaged
// its csi-loop target claim, that the thin overlay on it is a clean qcow2
// image that fits on its device, and that the golden image is unchanged.
func stopThinVM(ctx context.Context, vm, target, golden, goldenSHA string) {
	GinkgoHelper()
	Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
	waitVMIGone(ctx, vm)
	volume := csiLoopVolume(ctx, target)
	records := filepath.Join(filepath.Dir(filepath.Dir(volume)), "staged", "*", strings.TrimSuffix(filepath.Base(volume), ".img")+".json")
	Eventually(func() ([]string, error) {
		return filepath.Glob(records)
	}).WithContext(ctx).WithTimeout(2*time.Minute).Should(BeEmpty(), "kubelet unstaged the volume on every node")

	check := checkImage(ctx, volume)
	Expect(check.Clean()).To(BeTrue(), "qemu-img check of the thin overlay: %+v", check)
	// The device itself, not the claim's status: a resize still in flight
	// when the VM stopped has grown the one but not the other.
	device, err := os.Stat(volume)
	Expect(err).ToNot(HaveOccurred())
	Expect(check.ImageEndOffset).To(BeNumerically("<=", device.Size()), "the overlay fits on its device")
	Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image changed")
}

func boundVolume(ctx context.Context, claim string) string {
	pv, err := kubectl(ctx, "-n", namespace, "get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}")
	Expect(err).ToNot(HaveOccurred())
	Expect(pv).ToNot(BeEmpty(), "claim %s is bound", claim)
	return pv
}

// claimSizes are a claim's request and capacity in bytes.
func claimSizes(ctx context.Context, claim string) (request, capacity int64) {
	out, err := kubectl(ctx, "-n", namespace, "get", "pvc", claim, "-o",
		"jsonpath={.spec.resources.requests.storage} {.status.capacity.storage}")
	Expect(err).ToNot(HaveOccurred())
	fields := strings.Fields(out)
	Expect(fields).To(HaveLen(2), "request and capacity of %s: %q", claim, out)
	return quantityBytes(fields[0]), quantityBytes(fields[1])
}

// quantityBytes reads the binary-suffixed or plain quantities the API
// server writes for sizes set in bytes or Mi.
func quantityBytes(q string) int64 {
	mult := int64(1)
	for suffix, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if strings.HasSuffix(q, suffix) {
			q, mult = strings.TrimSuffix(q, suffix), m
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	Expect(err).ToNot(HaveOccurred(), "quantity %q", q)
	return n * mult
}

// vmiEvents are the messages of a VMI's events with the given reason.
func vmiEvents(ctx context.Context, vm, reason string) []string {
	out, err := kubectl(ctx, "-n", namespace, "get", "events", "--field-selector",
		"involvedObject.kind=VirtualMachineInstance,involvedObject.name="+vm+",reason="+reason,
		"-o", `jsonpath={range .items[*]}{.message}{"\n"}{end}`)
	Expect(err).ToNot(HaveOccurred())
	return strings.FieldsFunc(out, func(r rune) bool { return r == '\n' })
}

// waitVMIRunning waits until the VM's VMI runs, Ready or not: a guest
// paused for room fails its readiness probe.
func waitVMIRunning(ctx context.Context, vm string) {
	Eventually(func() (string, error) {
		return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", "jsonpath={.status.phase}")
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Equal("Running"))
}

func pausedReason(ctx context.Context, vm string) (string, error) {
	return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
		`jsonpath={.status.conditions[?(@.type=="Paused")].reason}`)
}

// thinClaim makes a Block-mode claim of size bytes on the csi-loop driver,
// which the external-resizer grows.
func thinClaim(ctx context.Context, name string, size int64) {
	thinClaimWithAccess(ctx, name, size, "ReadWriteOnce")
}

// thinClaimWithAccess is thinClaim with the given access mode.
func thinClaimWithAccess(ctx context.Context, name string, size int64, accessMode string) {
	Expect(apply(ctx, fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec:
  accessModes: [%s]
  volumeMode: Block
  storageClassName: csi-loop
  resources: {requests: {storage: %d}}
`, name, namespace, accessMode, size))).To(Succeed())
}

// holdThinClaims sets the ResourceQuota quota on the namespace's csi-loop
// claims: their requests may add up to what they request now (other
// specs' claims count too) and more bytes, until the spec ends or the
// quota is deleted.
func holdThinClaims(ctx context.Context, quota string, more int64) {
	out, err := kubectl(ctx, "-n", namespace, "get", "pvc", "-o",
		`jsonpath={.items[?(@.spec.storageClassName=="csi-loop")].spec.resources.requests.storage}`)
	Expect(err).ToNot(HaveOccurred())
	used := int64(0)
	for _, q := range strings.Fields(out) {
		used += quantityBytes(q)
	}
	Expect(apply(ctx, fmt.Sprintf(`
apiVersion: v1
kind: ResourceQuota
metadata: {name: %s, namespace: %s}
spec:
  hard: {csi-loop.storageclass.storage.k8s.io/requests.storage: "%d"}
`, quota, namespace, used+more))).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(kubectl(ctx, "-n", namespace, "delete", "resourcequota", quota, "--ignore-not-found")).Error().ToNot(HaveOccurred())
	})
}

var _ = Describe("thin volumes grown by a real CSI resizer", Ordered, Label(linuxGuestLabel), func() {
	const (
		golden  = "thin-golden"
		initial = 8 << 20
		// written is what the guest writes: five times the claim it
		// starts on, in pieces of 4 MiB, each made durable.
		written = 5 * initial
		piece   = 4 << 20
	)
	orders := fmt.Sprintf("pieces=%d,kib=%d", written/piece, piece>>10)
	var goldenImage string

	BeforeAll(func(ctx SpecContext) {
		deployCSILoop(ctx)
		goldenImage = linuxGolden(ctx, golden)
	})

	thinVM := func(name, target string) string {
		return linuxVMYAML(name, "Always", orders, fmt.Sprintf(`
overlay:
  backingPVC: {claimName: %s}
  backingFormat: raw
  persistent: true
  targetPVC: {claimName: %s}
  thinProvisioning: {chunkSize: 8Mi, freeThreshold: 4Mi}`, golden, target))
	}

	// verifyStopped stops the VM, checks its overlay (stopThinVM), and has
	// the guest's next boot read back every piece it published.
	verifyStopped := func(ctx context.Context, vm, target, goldenSHA string, published int) {
		stopThinVM(ctx, vm, target, goldenImage, goldenSHA)
		setGuestOrders(ctx, vm, "pieces=0")
		Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
		waitVMIReady(ctx, vm)
		Expect(waitLinuxDone(ctx, vm).Listed).To(Equal(published), "the pieces read back after the restart")
		deleteVM(ctx, vm)
	}

	It("admits a thin volume only for an author who may update its target claim, or on a claim an administrator opted in", func(ctx SpecContext) {
		const author, target = "vm-author", "thin-opt-in-target"
		// An author of VMs who may not touch claims: KubeVirt's edit role
		// alone.
		createServiceAccount(ctx, author, "kubevirt.io:edit")
		createTenant(ctx)
		thinClaim(ctx, target, initial)
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", target, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		})
		create := func(as string) error {
			_, err := kubectlIn(ctx, thinVM("thin-authorized", target), as, "create", "--dry-run=server", "-f", "-")
			return err
		}

		Expect(create("--as=system:serviceaccount:" + namespace + ":" + author)).To(MatchError(ContainSubstring(
			"spec.template.spec.volumes[0].overlay.thinProvisioning is not allowed: virt-controller would expand claim " + target +
				", which system:serviceaccount:" + namespace + ":" + author + " may not update")))
		Expect(create(asTenant)).To(Succeed(), "the namespace's editor may update the claim")

		Expect(kubectl(ctx, "-n", namespace, "label", "pvc", target, "kubevirt.io/thin-expansion=true")).Error().ToNot(HaveOccurred())
		Expect(create("--as=system:serviceaccount:"+namespace+":"+author)).To(Succeed(), "the administrator opted the claim in")
	})

	It("grows the claim while the guest writes five times its size, the guest seeing no I/O error", func(ctx SpecContext) {
		const vm, target = "thin", "thin-target"
		goldenSHA, err := testenv.SHA256(goldenImage)
		Expect(err).ToNot(HaveOccurred())
		thinClaim(ctx, target, initial)
		Expect(apply(ctx, thinVM(vm, target))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			deleteVM(ctx, vm)
			Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", target, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		})

		waitVMIRunning(ctx, vm)
		status := waitLinuxDone(ctx, vm)
		Expect(status.Published).To(HaveLen(written / piece))
		request, _ := claimSizes(ctx, target)
		Expect(request).To(BeNumerically(">", written), "virt-controller raised the request past what the guest wrote")
		Eventually(func() int64 {
			_, capacity := claimSizes(ctx, target)
			return capacity
		}).WithContext(ctx).WithTimeout(3*time.Minute).Should(Equal(request), "the resizer grows the volume to the request")
		Expect(len(vmiEvents(ctx, vm, "ExpandingThinVolume"))).To(BeNumerically(">=", 4), "one expansion per chunk at least")
		Expect(vmiEvents(ctx, vm, "FailedThinVolumeExpansion")).To(BeEmpty())
		maximum, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
			`jsonpath={.status.volumeStatus[?(@.name=="rootdisk")].thinProvisioning.maximumSize}`)
		Expect(err).ToNot(HaveOccurred())
		Expect(quantityBytes(maximum)).To(BeNumerically(">", fileSize(goldenImage)), "the VMI reports how far the overlay can grow")
		Expect(pausedReason(ctx, vm)).To(BeEmpty(), "the VMI runs on")

		verifyStopped(ctx, vm, target, goldenSHA, written/piece)
	}, SpecTimeout(15*time.Minute))

	It("pauses the VM while a quota holds the claim back, and resumes it once the claim grew", func(ctx SpecContext) {
		const vm, target, quota = "thin-held", "thin-held-target", "thin-hold"
		goldenSHA, err := testenv.SHA256(goldenImage)
		Expect(err).ToNot(HaveOccurred())
		// The claim may grow once, to two chunks; the guest needs five.
		holdThinClaims(ctx, quota, 2*initial)
		thinClaim(ctx, target, initial)
		Expect(apply(ctx, thinVM(vm, target))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			deleteVM(ctx, vm)
			Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", target, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		})

		waitVMIRunning(ctx, vm)
		By("pausing with PausedThinVolumeFull once the quota refuses the next expansion")
		Eventually(pausedReason).WithContext(ctx).WithArguments(vm).WithTimeout(startTimeout).WithPolling(time.Second).
			Should(Equal("PausedThinVolumeFull"))
		Eventually(func() []string { return vmiEvents(ctx, vm, "FailedThinVolumeExpansion") }).WithContext(ctx).
			WithTimeout(time.Minute).Should(ContainElement(ContainSubstring("exceeded quota")))
		request, _ := claimSizes(ctx, target)
		Expect(request).To(Equal(int64(2 * initial)))

		By("resuming by itself once the quota is lifted and the claim grew")
		Expect(kubectl(ctx, "-n", namespace, "delete", "resourcequota", quota)).Error().ToNot(HaveOccurred())
		status := waitLinuxDone(ctx, vm)
		Expect(status.Published).To(HaveLen(written / piece))
		Expect(pausedReason(ctx, vm)).To(BeEmpty())
		Expect(vmiEvents(ctx, vm, "ThinVolumeResumed")).ToNot(BeEmpty())

		verifyStopped(ctx, vm, target, goldenSHA, written/piece)
	}, SpecTimeout(15*time.Minute))
})
