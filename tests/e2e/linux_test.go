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
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The guest a spec's VMs boot, named in the suite's spec table: the Linux
// test guest (hack/guest-image.sh) or the boot-sector writer
// (internal/testenv/guest).
const (
	linuxGuestLabel      = "linux-guest"
	bootSectorGuestLabel = "boot-sector-guest"
)

// linuxTimeout bounds a boot of the Linux guest and its work: it runs
// emulated where KVM cannot boot it (hack/cluster.sh says so at install).
const linuxTimeout = 8 * time.Minute

// linuxVMYAML is vmYAML booting the Linux test guest from rootdisk, with
// the memory it needs, told what to do by orders (its SMBIOS serial, see
// hack/guest/guest-test).
func linuxVMYAML(name, runStrategy, orders, volumeSource string) string {
	return guestVMYAML(name, runStrategy, "256Mi", orders, volumeSource)
}

// linuxGolden makes the Linux test guest the golden image, disk.img on a
// Filesystem claim, and returns the image's path on this machine.
func linuxGolden(ctx context.Context, name string) string {
	return goldenClaim(ctx, name, func(image string) { copyLinuxGuest(ctx, image) })
}

// linuxDiskClaim is a writable claim of size bytes whose directory holds
// the Linux test guest as disk.img, the launcher's user's (107) like the
// directory; it returns the image's path.
func linuxDiskClaim(ctx context.Context, name string, size int64) string {
	return linuxDiskClaimWithAccess(ctx, name, size, "ReadWriteOnce")
}

// linuxDiskClaimWithAccess is linuxDiskClaim with the given access mode.
func linuxDiskClaimWithAccess(ctx context.Context, name string, size int64, accessMode string) string {
	dir := emptyFilesystemClaimWithAccess(ctx, name, size, accessMode)
	image := copyLinuxGuest(ctx, filepath.Join(dir, "disk.img"))
	Expect(os.Chown(dir, 107, 107)).To(Succeed())
	Expect(os.Chown(image, 107, 107)).To(Succeed())
	return image
}

// copyLinuxGuest copies the Linux test guest's image, built once, to path.
func copyLinuxGuest(ctx context.Context, path string) string {
	guest, err := testenv.LinuxGuestImage(ctx)
	framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
	Expect(exec.CommandContext(ctx, "cp", "--sparse=always", guest, path).Run()).To(Succeed())
	return path
}

// waitLinuxGuest waits until the Linux guest in the VM's running pod said
// what until asks for, and returns what it said.
func waitLinuxGuest(ctx context.Context, vm string, until func(testenv.LinuxGuestStatus) bool) testenv.LinuxGuestStatus {
	return waitLinuxGuestIn(ctx, namespace, vm, until)
}

// waitLinuxGuestIn is waitLinuxGuest for a VM of namespace ns.
func waitLinuxGuestIn(ctx context.Context, ns, vm string, until func(testenv.LinuxGuestStatus) bool) testenv.LinuxGuestStatus {
	var status testenv.LinuxGuestStatus
	Eventually(func(g Gomega) {
		pods, err := kubectl(ctx, "-n", ns, "get", "pods", "-l", "vm.kubevirt.io/name="+vm,
			"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(strings.Fields(pods)).To(HaveLen(1), "running virt-launcher pods of %s", vm)
		out, err := kubectl(ctx, "-n", ns, "logs", pods, "-c", "guest-console-log")
		g.Expect(err).ToNot(HaveOccurred())
		status = testenv.ParseLinuxGuest(testenv.WholeLines(out))
		g.Expect(until(status)).To(BeTrue(), "guest serial so far: %q", out)
	}).WithContext(ctx).WithTimeout(linuxTimeout).WithPolling(2 * time.Second).Should(Succeed())
	return status
}

// waitLinuxDone waits until the Linux guest did what it was told, and
// checks that it read back its golden content and every piece published
// before this boot.
func waitLinuxDone(ctx context.Context, vm string) testenv.LinuxGuestStatus {
	return waitLinuxDoneIn(ctx, namespace, vm)
}

// waitLinuxDoneIn is waitLinuxDone for a VM of namespace ns.
func waitLinuxDoneIn(ctx context.Context, ns, vm string) testenv.LinuxGuestStatus {
	status := waitLinuxGuestIn(ctx, ns, vm, func(s testenv.LinuxGuestStatus) bool { return s.Done })
	Expect(status.Consistent()).To(BeTrue(), "the guest of %s/%s: %+v", ns, vm, status)
	return status
}

// setGuestOrders sets what the VM's Linux guest does at its next boot
// (hack/guest/guest-test).
func setGuestOrders(ctx context.Context, vm, orders string) {
	Expect(kubectl(ctx, "-n", namespace, "patch", "vm", vm, "--type=merge",
		"-p", fmt.Sprintf(`{"spec":{"template":{"spec":{"domain":{"firmware":{"serial":%q}}}}}}`, orders))).Error().ToNot(HaveOccurred())
}

// fileSize is the size of the file at path.
func fileSize(path string) int64 {
	info, err := os.Stat(path)
	Expect(err).ToNot(HaveOccurred())
	return info.Size()
}

// checkImage is what qemu-img check says of the image at path, read
// without its backing.
func checkImage(ctx context.Context, path string) *qcow2.CheckResult {
	check, err := qcow2.Tool{}.Check(ctx, qcow2.WithoutBacking(path, qcow2.FormatQcow2), qcow2.InfoOptions{})
	Expect(err).ToNot(HaveOccurred())
	return check
}

var _ = Describe("a Linux guest on a persistent overlay", Ordered, Label(linuxGuestLabel), func() {
	BeforeAll(func(ctx SpecContext) {
		linuxGolden(ctx, "golden-linux")
	})

	persistent := func(target string) string {
		return fmt.Sprintf(`
overlay:
  backingPVC: {claimName: golden-linux}
  persistent: true
  targetPVC: {claimName: %s}`, target)
	}

	// The crash: QEMU killed outright, or the virt-launcher pod deleted
	// with no grace period. Either way nothing flushes what the guest did
	// not flush itself.
	killQEMU := func(ctx context.Context, vm string) {
		Expect(exec.CommandContext(ctx, "pkill", "-KILL", "-f", fmt.Sprintf("guest=%s_%s,", namespace, vm)).Run()).To(Succeed())
	}
	deletePod := func(ctx context.Context, vm string) {
		Expect(kubectl(ctx, "-n", namespace, "delete", "pod", launcherPod(ctx, vm), "--grace-period=0", "--force")).Error().ToNot(HaveOccurred())
	}

	// crashTarget is where a crash spec keeps its overlay: the volume's
	// YAML, and the overlay's image on this machine once the target
	// claim exists (and, for a provisioned one, is bound).
	type crashTarget struct {
		volume string
		image  func(ctx context.Context) string
		// grown tells, for a thin volume, that the claim grew while the
		// guest wrote: the crash comes after that.
		grown func(ctx context.Context, vm string) bool
	}
	fileTarget := func(ctx context.Context, vm string) crashTarget {
		image := filepath.Join(emptyFilesystemClaim(ctx, vm+"-target", 512<<20), "disk.qcow2")
		return crashTarget{volume: persistent(vm + "-target"), image: func(context.Context) string { return image }}
	}
	blockTarget := func(ctx context.Context, vm string) crashTarget {
		device := blockClaim(ctx, vm+"-target", 192<<20)
		return crashTarget{volume: persistent(vm + "-target"), image: func(context.Context) string { return device }}
	}
	thinTarget := func(ctx context.Context, vm string) crashTarget {
		deployCSILoop(ctx)
		claim := vm + "-target"
		Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", claim, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		thinClaim(ctx, claim, 8<<20)
		// The claim counts against quotas on the driver's class, which
		// the thin volume specs set.
		DeferCleanup(func(ctx SpecContext) {
			deleteVM(ctx, vm)
			Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", claim, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		})
		return crashTarget{
			volume: persistent(claim) + "\n  thinProvisioning: {chunkSize: 8Mi, freeThreshold: 4Mi}",
			image:  func(ctx context.Context) string { return csiLoopVolume(ctx, claim) },
			grown: func(ctx context.Context, vm string) bool {
				return len(vmiEvents(ctx, vm, "ExpandingThinVolume")) > 0
			},
		}
	}

	DescribeTable("keeps every piece the guest made durable when it crashes while writing, and the overlay checks clean",
		func(ctx SpecContext, vm string, targetOf func(ctx context.Context, vm string) crashTarget, crash func(ctx context.Context, vm string)) {
			deleteVM(ctx, vm)
			target := targetOf(ctx, vm)
			Expect(apply(ctx, linuxVMYAML(vm, "Manual", "pieces=all", target.volume))).To(Succeed())
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIRunning(ctx, vm)
			before := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool {
				return len(s.Published) >= 3 && (target.grown == nil || target.grown(ctx, vm))
			})
			Expect(before.Golden).To(Equal("OK"))

			crash(ctx, vm)
			Eventually(func() (string, error) {
				return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "--ignore-not-found", "-o", "jsonpath={.status.phase}")
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(BeElementOf("Failed", "Succeeded", ""))
			// A pod deleted by force leaves the API before its containers
			// are gone: wait for QEMU itself.
			Eventually(func() error {
				return exec.CommandContext(ctx, "pgrep", "-f", fmt.Sprintf("guest=%s_%s,", namespace, vm)).Run()
			}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(HaveOccurred(), "QEMU of %s still runs", vm)
			// QEMU is gone: the overlay is as the crash left it.
			image := target.image(ctx)
			afterCrash := checkImage(ctx, image)

			// The next boot only reads back what was published.
			setGuestOrders(ctx, vm, "pieces=0")
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIRunning(ctx, vm)
			after := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Done })
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			afterReboot := checkImage(ctx, image)

			AddReportEntry("crash consistency", fmt.Sprintf(
				"published before the crash (at least): %d; verified after it: %d of %d listed; "+
					"qemu-img check after the crash: %d errors, %d corruptions, %d leaks; after the next boot: %d errors, %d corruptions, %d leaks",
				len(before.Published), after.Verified, after.Listed,
				afterCrash.CheckErrors, afterCrash.Corruptions, afterCrash.Leaks,
				afterReboot.CheckErrors, afterReboot.Corruptions, afterReboot.Leaks))
			Expect(after.Boot).To(Equal(2))
			Expect(after.Consistent()).To(BeTrue(), "the guest after the crash: %+v", after)
			Expect(after.Listed).To(BeNumerically(">=", len(before.Published)))
			for _, check := range []*qcow2.CheckResult{afterCrash, afterReboot} {
				Expect(check.CheckErrors).To(BeZero())
				Expect(check.Corruptions).To(BeZero())
			}
			deleteVM(ctx, vm)
		},
		Entry("QEMU killed, on a Filesystem target claim", "crash-fs", fileTarget, killQEMU, SpecTimeout(25*time.Minute)),
		Entry("QEMU killed, on a Block-mode target claim", "crash-block", blockTarget, killQEMU, SpecTimeout(25*time.Minute)),
		Entry("QEMU killed while its thin volume grows", "crash-thin", thinTarget, killQEMU, SpecTimeout(25*time.Minute)),
		Entry("the virt-launcher pod deleted with no grace period, on a Filesystem target claim", "crash-pod", fileTarget, deletePod, SpecTimeout(25*time.Minute)),
	)

	// scratch is what the guest writes and deletes before it trims
	// (hack/guest/guest-test).
	const scratch = 32 << 20

	DescribeTable("gives back the space of what the guest deletes and trims",
		func(ctx SpecContext, vm string, targetOf func(ctx context.Context) (target, file string)) {
			deleteVM(ctx, vm)
			_, file := targetOf(ctx)
			Expect(apply(ctx, linuxVMYAML(vm, "Manual", "pieces=0,trim", persistent(vm+"-target")))).To(Succeed())
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIReady(ctx, vm)
			status := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Done })
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			allocated := allocatedBytes(file)
			AddReportEntry("discard", fmt.Sprintf("fstrim released %d bytes; the target holds %d bytes after the guest wrote and deleted %d",
				status.Trimmed, allocated, scratch))
			Expect(status.Trimmed).To(BeNumerically(">=", scratch))
			Expect(allocated).To(BeNumerically("<", scratch/2))
			deleteVM(ctx, vm)
		},
		Entry("on a Filesystem target claim", "trim-fs", func(ctx context.Context) (string, string) {
			target := filepath.Join(emptyFilesystemClaim(ctx, "trim-fs-target", 512<<20), "disk.qcow2")
			return target, target
		}, SpecTimeout(15*time.Minute)),
		Entry("on a Block-mode target claim, down to the loop device's file", "trim-block", func(ctx context.Context) (string, string) {
			return blockClaim(ctx, "trim-block-target", 192<<20), filepath.Join(volumesDir, "trim-block-target.img")
		}, SpecTimeout(15*time.Minute)),
	)
})

// allocatedBytes is how much of the file the file system holds.
func allocatedBytes(path string) int64 {
	var st syscall.Stat_t
	Expect(syscall.Stat(path, &st)).To(Succeed())
	return st.Blocks * 512
}
