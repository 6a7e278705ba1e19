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
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// linuxDiskImage is the Linux test guest as a containerDisk, as a user
// would push it: the raw image under /disk/, KubeVirt's qemu user's.
const linuxDiskImage = "registry.e2e.test/linux-guest:v1"

// linuxDiskArchive builds linuxDiskImage as a docker archive in dir.
func linuxDiskArchive(ctx context.Context, dir string) string {
	guest, err := testenv.LinuxGuestImage(ctx)
	framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
	img, err := ociimage.Build(ctx, ociimage.Spec{Files: []ociimage.File{
		{Path: "/disk/disk.img", Source: guest, Mode: 0o440, UID: 107, GID: 107},
	}})
	Expect(err).ToNot(HaveOccurred())
	archive := filepath.Join(dir, "linux-guest-disk.tar")
	Expect(ociimage.WriteArchive(ctx, archive, linuxDiskImage, img)).To(Succeed())
	return archive
}

// migrationState is what a VMI's status says of its last migration, and
// how KubeVirt moves its disks: BlockMigration copies the local ones,
// LiveMigration only memory and devices.
type migrationState struct {
	completed, failed      bool
	sourceNode, targetNode string
	method                 string
	// sourcePodUID is the source's virt-launcher pod.
	sourcePodUID string
}

// migrate live-migrates the VM with virtctl, waits until the migration
// ended and the source's launcher with it, and returns what the VMI says
// of it.
func migrate(ctx context.Context, vm string) migrationState {
	return startMigration(ctx, vm).wait(ctx)
}

// pendingMigration is a migration of vm asked for, from the pod
// sourcePod; the VMI showed the migration lastUID before.
type pendingMigration struct {
	vm, sourcePod, sourcePodUID, lastUID string
}

// startMigration asks for a live migration of the VM with virtctl.
func startMigration(ctx context.Context, vm string) pendingMigration {
	sourcePod := launcherPod(ctx, vm)
	// The VMI shows its last migration until the next one starts.
	last, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", "jsonpath={.status.migrationState.migrationUid}")
	Expect(err).ToNot(HaveOccurred())
	m := pendingMigration{vm: vm, sourcePod: sourcePod, sourcePodUID: podUID(ctx, sourcePod), lastUID: last}
	Expect(virtctl(ctx, "-n", namespace, "migrate", vm)).Error().ToNot(HaveOccurred())
	return m
}

// running waits until the migration moves the VM's memory, and returns
// its target pod.
func (m pendingMigration) running(ctx context.Context) string {
	var target string
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi", m.vm, "-o", `jsonpath={.status.migrationState.migrationUid}`+
			`|{.status.migrationState.startTimestamp}|{.status.migrationState.targetPod}|{.status.migrationState.completed}`)
		g.Expect(err).ToNot(HaveOccurred())
		f := strings.Split(out, "|")
		g.Expect(f).To(HaveLen(4))
		g.Expect(f[0]).ToNot(BeElementOf("", m.lastUID), "migration of %s not started yet", m.vm)
		g.Expect(f[1]).ToNot(BeEmpty(), "migration of %s not started yet", m.vm)
		g.Expect(f[3]).ToNot(Equal("true"), "migration of %s ended before it was caught running", m.vm)
		target = f[2]
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	return target
}

// wait waits until the migration ended, and the source's launcher with it
// if it completed, and returns what the VMI says of it.
func (m pendingMigration) wait(ctx context.Context) migrationState {
	vm, last, sourcePod, sourcePodUID := m.vm, m.lastUID, m.sourcePod, m.sourcePodUID
	var state migrationState
	Eventually(func(g Gomega) {
		// A false flag is left out: fields are separated, not split on
		// blanks.
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", `jsonpath={.status.migrationState.migrationUid}`+
			`|{.status.migrationState.completed}|{.status.migrationState.failed}|{.status.migrationState.sourceNode}`+
			`|{.status.migrationState.targetNode}|{.status.migrationMethod}`)
		g.Expect(err).ToNot(HaveOccurred())
		f := strings.Split(out, "|")
		g.Expect(f).To(HaveLen(6), "the VMI's migrationState: %q", out)
		g.Expect(f[0]).ToNot(BeElementOf("", last), "migration of %s not started yet", vm)
		state = migrationState{f[1] == "true", f[2] == "true", f[3], f[4], f[5], sourcePodUID}
		g.Expect(state.completed || state.failed).To(BeTrue(), "migration of %s: %+v", vm, state)
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	if state.completed && !state.failed {
		// The source's launcher ends once the domain left it.
		Eventually(func() (string, error) {
			return kubectl(ctx, "-n", namespace, "get", "pod", sourcePod, "--ignore-not-found", "-o", "jsonpath={.status.phase}")
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(Or(BeEmpty(), Equal("Succeeded")),
			"the source's launcher %s", sourcePod)
	}
	return state
}

// migratedAway checks what a completed migration of the VM left: the VMI
// runs on the target node, another than the source, KubeVirt moved its
// disks by method, one QEMU runs the VM, and the source node keeps no mount
// of the source's pod nor an overlay in its directory.
func migratedAway(ctx context.Context, vm string, state migrationState, method string) {
	GinkgoHelper()
	Expect(state.failed).To(BeFalse(), "%+v", state)
	Expect(state.method).To(Equal(method))
	Expect(state.targetNode).ToNot(Equal(state.sourceNode))
	Expect(vmiNode(ctx, vm)).To(Equal(state.targetNode))
	Expect(exec.CommandContext(ctx, "pgrep", "-c", "-f", fmt.Sprintf("guest=%s_%s,", namespace, vm)).Output()).
		To(BeEquivalentTo("1\n"), "QEMU processes of %s", vm)
	Eventually(func() (string, error) {
		return inNode(ctx, "--node", state.sourceNode, "sh", "-c", fmt.Sprintf(
			"grep -F %[1]s /proc/self/mountinfo; find /var/lib/kubelet/pods/%[1]s -name '*.qcow2' 2>/dev/null; true", state.sourcePodUID))
	}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(2*time.Second).Should(BeEmpty(),
		"what node %s keeps of the source's pod", state.sourceNode)
}

// waitKubeVirtRelease waits until KubeVirt's components run the release
// (the tag of their images) and KubeVirt is Available.
func waitKubeVirtRelease(ctx context.Context, release string) {
	Eventually(func() (string, error) {
		return kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o",
			`jsonpath={.status.observedKubeVirtVersion} {.status.conditions[?(@.type=="Available")].status}`)
	}).WithContext(ctx).WithTimeout(10 * time.Minute).WithPolling(5 * time.Second).Should(Equal(release + " True"))
}

// waitLiveMigratable waits until the VM's VMI is live-migratable: a
// hotplugged containerDisk is once virt-handler recorded its checksum.
func waitLiveMigratable(ctx context.Context, vm string) {
	Eventually(func() (string, error) {
		return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
			`jsonpath={.status.conditions[?(@.type=="LiveMigratable")].status} {.status.conditions[?(@.type=="LiveMigratable")].message}`)
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(HavePrefix("True"))
}

// vmiNode is the node the VM's VMI runs on.
func vmiNode(ctx context.Context, vm string) string {
	out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", "jsonpath={.status.nodeName}")
	Expect(err).ToNot(HaveOccurred())
	Expect(out).ToNot(BeEmpty())
	return out
}

var _ = Describe("live migration between two nodes", Ordered, Label(twoNodesLabel, linuxGuestLabel), func() {
	BeforeAll(func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		tools, _ := toolsArchive(ctx, dir)
		Expect(run(ctx, clusterScript, "import", linuxDiskArchive(ctx, dir), tools)).To(Succeed())
	})

	// The baseline every overlay case compares with: KubeVirt moves a
	// containerDisk (an overlay in the pod over the image) by copying the
	// overlay, through its migration proxies, from one node's pod network
	// to the other's. A writable hotplugged containerDisk's overlay is
	// copied the same way: there and back, the guest reads on each node
	// what it wrote to it before.
	It("moves a containerDisk VM and its writable hotplugged containerDisk to the other node and back", func(ctx SpecContext) {
		const vm = "migrate-cd"
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=2,hotplug",
			"containerDisk: {image: "+linuxDiskImage+", imagePullPolicy: Never}"))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
		Expect(waitLinuxDone(ctx, vm).Published).To(HaveLen(2))
		source := vmiNode(ctx, vm)
		addImage(ctx, vm, "scratch", "--writable")
		wrote := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Writes) > 0 }).Writes[0]
		Expect(wrote.Failed).To(BeFalse(), "the guest's write: %+v", wrote)

		for i, probe := range []string{"probe-there", "probe-back"} {
			waitLiveMigratable(ctx, vm)
			state := migrate(ctx, vm)
			migratedAway(ctx, vm, state, "BlockMigration")
			// There from the VM's first node, back to it.
			if i == 0 {
				Expect(state.sourceNode).To(Equal(source), "%+v", state)
			} else {
				Expect(state.targetNode).To(Equal(source), "%+v", state)
			}
			// Another disk plugged in has the guest read back the first;
			// the new pod's console shows only what the guest said since.
			addImage(ctx, vm, probe)
			status := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Reads) > 0 })
			Expect(status.Reads).To(Equal([]testenv.DiskRead{{Device: wrote.Device, OK: true}}), "on %s", state.targetNode)
			Expect(status.Errors).To(BeEmpty())
		}
	})

	// Overlay VMs move while their guest writes, there and back: the guest
	// writes a piece every two seconds, then reboots itself (the VM, its
	// VMI and an ephemeral overlay stay) and reads back every piece before
	// writing more. Each boot's writes span a migration.
	const writeWhileMigrating = "pieces=10,pause=2,reboots=2"
	const piecesPerBoot = 10

	// migrateWhileWriting migrates the VM once its guest is writing at the
	// given boot, and checks what the migration left.
	migrateWhileWriting := func(ctx context.Context, vm string, boot int, method string) migrationState {
		GinkgoHelper()
		status := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == boot && len(s.Published) >= 2 })
		Expect(status.Consistent()).To(BeTrue(), "%+v", status)
		Expect(status.Done).To(BeFalse(), "the guest stopped writing before the migration: %+v", status)
		waitLiveMigratable(ctx, vm)
		state := migrate(ctx, vm)
		migratedAway(ctx, vm, state, method)
		return state
	}

	// thereAndBack migrates the VM while its guest writes, and back while
	// it writes at its next boot; at the boot after that the guest read
	// back every piece written before.
	thereAndBack := func(ctx context.Context, vm, method string) {
		GinkgoHelper()
		source := vmiNode(ctx, vm)
		there := migrateWhileWriting(ctx, vm, 1, method)
		Expect(there.sourceNode).To(Equal(source))
		back := migrateWhileWriting(ctx, vm, 2, method)
		Expect(back.targetNode).To(Equal(source))
		final := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 3 && s.Done })
		Expect(final.Consistent()).To(BeTrue(), "%+v", final)
		Expect(final.Listed).To(Equal(2*piecesPerBoot), "%+v", final)
	}

	// The golden image both nodes mount read-only.
	var golden, goldenSHA string
	goldenOnce := func(ctx context.Context) {
		if golden != "" {
			return
		}
		golden = linuxGolden(ctx, "golden-migrate")
		var err error
		goldenSHA, err = testenv.SHA256(golden)
		Expect(err).ToNot(HaveOccurred())
	}

	It("moves a VM on an ephemeral overlay, copying only the overlay, while its guest writes", func(ctx SpecContext) {
		const vm = "migrate-ephemeral"
		goldenOnce(ctx)
		Expect(apply(ctx, linuxVMYAML(vm, "Always", writeWhileMigrating, `
overlay:
  backingPVC: {claimName: golden-migrate}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)

		thereAndBack(ctx, vm, "BlockMigration")
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image")
	})

	// A persistent overlay on a ReadWriteMany target claim, which QEMU
	// hands over: a directory both nodes see, or a loop device both open.
	// targetOn makes the claim, and returns the volume and the overlay's
	// image on this machine.
	type targetOn func(ctx context.Context, vm string) (volume, image string)
	persistentOn := func(claim string) string {
		return fmt.Sprintf(`
overlay:
  backingPVC: {claimName: golden-migrate}
  persistent: true
  targetPVC: {claimName: %s}`, claim)
	}
	var rwxFilesystem targetOn = func(ctx context.Context, vm string) (string, string) {
		dir := emptyFilesystemClaimWithAccess(ctx, vm+"-target", 512<<20, "ReadWriteMany")
		Expect(os.Chown(dir, 107, 107)).To(Succeed())
		return persistentOn(vm + "-target"), filepath.Join(dir, "disk.qcow2")
	}
	var rwxBlock targetOn = func(ctx context.Context, vm string) (string, string) {
		return persistentOn(vm + "-target"), blockClaimWithAccess(ctx, vm+"-target", 192<<20, "ReadWriteMany")
	}
	persistentOverlay := func(ctx context.Context, vm string) string {
		volume, _ := rwxFilesystem(ctx, vm)
		return volume
	}

	DescribeTable("moves a VM on a persistent overlay on a ReadWriteMany claim, handing the overlay over, while its guest writes",
		func(ctx SpecContext, vm string, target targetOn) {
			goldenOnce(ctx)
			volume, image := target(ctx, vm)
			Expect(apply(ctx, linuxVMYAML(vm, "Always", writeWhileMigrating, volume))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
			waitVMIReady(ctx, vm)

			thereAndBack(ctx, vm, "LiveMigration")

			// The overlay outlives the VMI: the next one reads back all of it.
			Expect(virtctl(ctx, "-n", namespace, "restart", vm)).Error().ToNot(HaveOccurred())
			again := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 4 && s.Done })
			Expect(again.Consistent()).To(BeTrue(), "%+v", again)
			Expect(again.Listed).To(Equal(3*piecesPerBoot), "%+v", again)
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			check := checkImage(ctx, image)
			Expect(check.CheckErrors).To(BeZero())
			Expect(check.Corruptions).To(BeZero())
			Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image")
		},
		Entry("a Filesystem claim", "migrate-persistent", rwxFilesystem),
		Entry("a Block claim", "migrate-persistent-block", rwxBlock),
	)

	// A thin overlay on a ReadWriteMany Block claim of csi-loop, both nodes
	// staging it on a loop device of their own: each boot writes 20 MiB
	// onto a claim that starts at 8 MiB, across a migration, so the claim
	// grows on either node and while both have it. The target's
	// virt-launcher arms its own write threshold: QEMU's is not migrated.
	// First a quota holds the claim at 8 MiB: the VMI pauses on the full
	// volume and cannot migrate, saying why, until the claim grows.
	It("moves a VM on a thin overlay on a ReadWriteMany Block claim, the claim growing wherever it runs, while its guest writes", func(ctx SpecContext) {
		const vm, target, initial, quota = "migrate-thin", "migrate-thin-target", 8 << 20, "migrate-thin-hold"
		goldenOnce(ctx)
		deployCSILoop(ctx)
		holdThinClaims(ctx, quota, initial)
		thinClaimWithAccess(ctx, target, initial, "ReadWriteMany")
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", target, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		})
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=10,kib=2048,pause=3,reboots=2", fmt.Sprintf(`
overlay:
  backingPVC: {claimName: golden-migrate}
  persistent: true
  targetPVC: {claimName: %s}
  thinProvisioning: {chunkSize: 16Mi, freeThreshold: 8Mi}`, target)))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIRunning(ctx, vm)

		By("keeping the VMI on its node while it is paused on the full volume")
		Eventually(pausedReason).WithContext(ctx).WithArguments(vm).WithTimeout(startTimeout).WithPolling(time.Second).
			Should(Equal("PausedThinVolumeFull"))
		const why = "thin provisioned overlay volume rootdisk is full and the VMI is paused until its target claim grows, it can migrate once it resumes"
		Eventually(func() (string, error) {
			return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
				`jsonpath={.status.conditions[?(@.type=="LiveMigratable")].status}: {.status.conditions[?(@.type=="LiveMigratable")].message}`)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(Equal("False: cannot migrate VMI: " + why))
		Expect(virtctl(ctx, "-n", namespace, "migrate", vm)).Error().To(MatchError(ContainSubstring(why)))
		Expect(kubectl(ctx, "-n", namespace, "delete", "resourcequota", quota)).Error().ToNot(HaveOccurred())
		waitVMIReady(ctx, vm)
		waitLiveMigratable(ctx, vm)

		source := vmiNode(ctx, vm)
		for boot := 1; boot <= 2; boot++ {
			state := migrateWhileWriting(ctx, vm, boot, "LiveMigration")
			if boot == 1 {
				Expect(state.sourceNode).To(Equal(source))
			} else {
				Expect(state.targetNode).To(Equal(source), "back")
			}
			Eventually(func() (string, error) {
				return virsh(ctx, vm, "domstats", "--block", namespace+"_"+vm)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).Should(MatchRegexp(`block\.\d+\.threshold=[1-9]`),
				"a write threshold armed on %s", state.targetNode)
		}
		final := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 3 && s.Done })
		Expect(final.Consistent()).To(BeTrue(), "%+v", final)
		Expect(final.Listed).To(Equal(2*piecesPerBoot), "%+v", final)
		Expect(pausedReason(ctx, vm)).To(BeEmpty(), "the VMI runs on")
		request, _ := claimSizes(ctx, target)
		Expect(request).To(BeNumerically(">", int64(2*piecesPerBoot)*(2<<20)), "virt-controller raised the request past what the guest wrote")

		stopThinVM(ctx, vm, target, golden, goldenSHA)
	})

	It("keeps a VM over a ReadWriteOnce backing on its node, saying why", func(ctx SpecContext) {
		const vm = "migrate-rwo"
		goldenOnce(ctx)
		localClaim(ctx, "golden-migrate-rwo", filepath.Dir(golden), "Filesystem", "ReadWriteOnce", fileSize(golden))
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=1", `
overlay:
  backingPVC: {claimName: golden-migrate-rwo}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)

		Eventually(func() (string, error) {
			return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
				`jsonpath={.status.conditions[?(@.type=="LiveMigratable")].status}: {.status.conditions[?(@.type=="LiveMigratable")].message}`)
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Equal(
			"False: cannot migrate VMI: backing PVC golden-migrate-rwo of overlay volume rootdisk is not shared, " +
				"the target node must mount it too (ReadOnlyMany or ReadWriteMany access mode)"))
		Expect(virtctl(ctx, "-n", namespace, "migrate", vm)).Error().To(MatchError(ContainSubstring("not shared")))
	})

	// A migration slowed down to a crawl, 4 MiB/s, for faults to hit it
	// while it runs.
	slowMigrations := func(ctx context.Context) {
		Expect(apply(ctx, `
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: e2e-slow}
spec:
  bandwidthPerMigration: 4Mi
  selectors:
    virtualMachineInstanceSelector: {e2e-migration: slow}`)).To(Succeed())
	}
	slowVMYAML := func(vm, orders, volume string) string {
		yaml := linuxVMYAML(vm, "Always", orders, volume)
		return strings.Replace(yaml, "  template:\n    spec:\n", "  template:\n    metadata: {labels: {e2e-migration: slow}}\n    spec:\n", 1)
	}
	ephemeralOverlay := func(context.Context, string) string {
		return `
overlay:
  backingPVC: {claimName: golden-migrate}`
	}

	// A migration hit while it runs: the VM goes on where it was, or
	// where it went, and its guest reads back at its next boot every
	// piece it wrote.
	DescribeTable("keeps an overlay VM running, its overlay whole, when its migration is hit",
		func(ctx SpecContext, vm string, volume func(context.Context, string) string, hit func(ctx context.Context, m pendingMigration, target string), mustFail bool) {
			goldenOnce(ctx)
			slowMigrations(ctx)
			Expect(apply(ctx, slowVMYAML(vm, "pieces=10,pause=2,reboots=1", volume(ctx, vm)))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
			waitVMIReady(ctx, vm)
			source := vmiNode(ctx, vm)
			waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Published) >= 2 })

			m := startMigration(ctx, vm)
			hit(ctx, m, m.running(ctx))
			state := m.wait(ctx)
			if mustFail {
				Expect(state.failed).To(BeTrue(), "%+v", state)
				Expect(vmiNode(ctx, vm)).To(Equal(source))
			}

			final := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 2 && s.Done })
			Expect(final.Consistent()).To(BeTrue(), "%+v", final)
			Expect(final.Listed).To(Equal(piecesPerBoot), "%+v", final)
			Expect(exec.CommandContext(ctx, "pgrep", "-c", "-f", fmt.Sprintf("guest=%s_%s,", namespace, vm)).Output()).
				To(BeEquivalentTo("1\n"), "QEMU processes of %s", vm)
			Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image")
		},
		Entry("the target pod deleted, a persistent overlay", "hit-target-pod", persistentOverlay,
			func(ctx context.Context, _ pendingMigration, target string) {
				Expect(kubectl(ctx, "-n", namespace, "delete", "pod", target, "--grace-period=0", "--force")).Error().ToNot(HaveOccurred())
			}, true),
		Entry("the migration cancelled, an ephemeral overlay", "hit-cancel", ephemeralOverlay,
			func(ctx context.Context, m pendingMigration, _ string) {
				Expect(virtctl(ctx, "-n", namespace, "migrate-cancel", m.vm)).Error().ToNot(HaveOccurred())
			}, true),
		Entry("the source's virt-handler restarted, a persistent overlay", "hit-handler", persistentOverlay,
			func(ctx context.Context, m pendingMigration, _ string) {
				node, err := kubectl(ctx, "-n", namespace, "get", "pod", m.sourcePod, "-o", "jsonpath={.spec.nodeName}")
				Expect(err).ToNot(HaveOccurred())
				Expect(kubectl(ctx, "-n", "kubevirt", "delete", "pod", "-l", "kubevirt.io=virt-handler",
					"--field-selector=spec.nodeName="+node)).Error().ToNot(HaveOccurred())
			}, false),
	)

	// A node drained for maintenance: its overlay VMs, whose eviction
	// strategy is LiveMigrate, move to the other node instead of stopping.
	It("moves every overlay VM off a drained node", func(ctx SpecContext) {
		goldenOnce(ctx)
		nodes := clusterNodes()
		drained, other := nodes[0], nodes[1]
		// Both VMs start on the node to drain.
		Expect(kubectl(ctx, "cordon", other)).Error().ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "uncordon", drained)).Error().ToNot(HaveOccurred())
			Expect(kubectl(ctx, "uncordon", other)).Error().ToNot(HaveOccurred())
		})
		vms := map[string]string{
			"drain-ephemeral":  ephemeralOverlay(ctx, "drain-ephemeral"),
			"drain-persistent": persistentOverlay(ctx, "drain-persistent"),
		}
		for vm, volume := range vms {
			yaml := strings.Replace(linuxVMYAML(vm, "Always", "pieces=10,pause=2,reboots=1", volume),
				"      terminationGracePeriodSeconds: 0\n", "      terminationGracePeriodSeconds: 0\n      evictionStrategy: LiveMigrate\n", 1)
			Expect(apply(ctx, yaml)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		}
		for vm := range vms {
			waitVMIReady(ctx, vm)
			Expect(vmiNode(ctx, vm)).To(Equal(drained))
			waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Published) >= 2 })
		}
		Expect(kubectl(ctx, "uncordon", other)).Error().ToNot(HaveOccurred())

		Expect(kubectl(ctx, "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data",
			"--pod-selector=kubevirt.io=virt-launcher", "--timeout=5m")).Error().ToNot(HaveOccurred())
		for vm := range vms {
			Expect(vmiNode(ctx, vm)).To(Equal(other), vm)
			final := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 2 && s.Done })
			Expect(final.Consistent()).To(BeTrue(), "%s: %+v", vm, final)
			Expect(final.Listed).To(Equal(piecesPerBoot), "%s: %+v", vm, final)
		}
	})

	// KubeVirt updated in place: its components under another tag, as a
	// new release would be. With workload updates by live migration,
	// KubeVirt moves the running overlay VMs onto the new virt-launcher.
	It("moves running overlay VMs onto the new virt-launcher when KubeVirt is updated", func(ctx SpecContext) {
		goldenOnce(ctx)
		vms := map[string]string{
			"update-ephemeral":  ephemeralOverlay(ctx, "update-ephemeral"),
			"update-persistent": persistentOverlay(ctx, "update-persistent"),
		}
		for vm, volume := range vms {
			Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=2,hotplug", volume))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		}
		for vm := range vms {
			waitVMIReady(ctx, vm)
			waitLinuxDone(ctx, vm)
		}

		const release = "dev2"
		for _, component := range []string{"virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-launcher"} {
			Expect(run(ctx, clusterScript, "tag", "docker.io/kubevirt-qcow2/"+component+":dev",
				"docker.io/kubevirt-qcow2/"+component+":"+release)).To(Succeed())
		}
		// KubeVirt is not what the suite installed any more: a later spec
		// gets fresh nodes (rolling back would take as long).
		DeferCleanup(func() { installed = cluster{} })
		Expect(kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type=merge",
			"-p", `{"spec":{"imageTag":"`+release+`","workloadUpdateStrategy":{"workloadUpdateMethods":["LiveMigrate"]}}}`)).Error().ToNot(HaveOccurred())
		waitKubeVirtRelease(ctx, release)

		for vm := range vms {
			Eventually(func() (string, error) {
				return kubectl(ctx, "-n", namespace, "get", "pods", "-l", "vm.kubevirt.io/name="+vm, "--field-selector=status.phase=Running",
					"-o", `jsonpath={.items[*].spec.containers[?(@.name=="compute")].image}`)
			}).WithContext(ctx).WithTimeout(5*time.Minute).WithPolling(2*time.Second).Should(Equal("kubevirt-qcow2/virt-launcher:"+release), vm)
		}
		// Both guests go on in their new pods: one writes to a disk
		// plugged in there, the other reads back its pieces in a new VMI.
		addImage(ctx, "update-ephemeral", "scratch", "--writable")
		status := waitLinuxGuest(ctx, "update-ephemeral", func(s testenv.LinuxGuestStatus) bool { return len(s.Writes) > 0 })
		Expect(status.Writes[0].Failed).To(BeFalse(), "%+v", status)
		Expect(virtctl(ctx, "-n", namespace, "restart", "update-persistent")).Error().ToNot(HaveOccurred())
		again := waitLinuxGuest(ctx, "update-persistent", func(s testenv.LinuxGuestStatus) bool { return s.Boot == 2 && s.Done })
		Expect(again.Consistent()).To(BeTrue(), "%+v", again)
		Expect(again.Listed).To(Equal(2), "%+v", again)
	})
})
