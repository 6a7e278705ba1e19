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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// linuxGuestLabel marks the specs that boot the Linux test guest
// (hack/guest-image.sh) rather than the boot sector.
const linuxGuestLabel = "linux-guest"

// linuxTimeout bounds a boot of the Linux guest and its work: it runs
// emulated where KVM cannot boot it (hack/cluster.sh says so at install).
const linuxTimeout = 8 * time.Minute

// linuxVMYAML is a VirtualMachine booting the Linux test guest from
// rootdisk, told what to do by orders (its SMBIOS serial, see
// hack/guest/guest-test).
func linuxVMYAML(name, runStrategy, orders, volumeSource string) string {
	return fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: %s, namespace: %s}
spec:
  runStrategy: %s
  template:
    spec:
      terminationGracePeriodSeconds: 0
      domain:
        cpu: {features: [{name: arch-capabilities, policy: disable}]}
        firmware: {serial: "%s"}
        resources: {requests: {memory: 256Mi}}
        devices:
          autoattachPodInterface: false
          autoattachGraphicsDevice: false
          disks:
          - name: rootdisk
            disk: {bus: virtio}
      volumes:
      - name: rootdisk
%s
`, name, namespace, runStrategy, orders, indent(volumeSource, "        "))
}

// linuxGolden makes the Linux test guest the golden image, disk.img on a
// Filesystem claim, and returns the image's path on this machine.
func linuxGolden(ctx context.Context, name string) string {
	guest, err := testenv.LinuxGuestImage(ctx)
	framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
	dir := filepath.Join(volumesDir, name)
	Expect(os.RemoveAll(dir)).To(Succeed())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	image := filepath.Join(dir, "disk.img")
	Expect(exec.CommandContext(ctx, "cp", "--sparse=always", guest, image).Run()).To(Succeed())
	info, err := os.Stat(image)
	Expect(err).ToNot(HaveOccurred())
	localClaim(ctx, name, dir, "Filesystem", "ReadOnlyMany", info.Size())
	return image
}

// waitLinuxGuest waits until the Linux guest in the VM's running pod said
// what until asks for, and returns what it said.
func waitLinuxGuest(ctx context.Context, vm string, until func(testenv.LinuxGuestStatus) bool) testenv.LinuxGuestStatus {
	pod := launcherPod(ctx, vm)
	var status testenv.LinuxGuestStatus
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "logs", pod, "-c", "guest-console-log")
		g.Expect(err).ToNot(HaveOccurred())
		status = testenv.ParseLinuxGuest(testenv.WholeLines(out))
		g.Expect(until(status)).To(BeTrue(), "guest serial so far: %q", out)
	}).WithContext(ctx).WithTimeout(linuxTimeout).WithPolling(2 * time.Second).Should(Succeed())
	return status
}

// qemuImgCheck is what qemu-img check says of the image at path, read
// without its backing.
type qemuImgCheck struct {
	CheckErrors int `json:"check-errors"`
	Corruptions int `json:"corruptions"`
	Leaks       int `json:"leaks"`
}

func checkImage(ctx context.Context, path string) qemuImgCheck {
	out, _ := testenv.QemuImg(ctx, "check", "--output=json", qcow2.WithoutBacking(path, qcow2.FormatQcow2))
	var check qemuImgCheck
	Expect(json.Unmarshal([]byte(out), &check)).To(Succeed(), "qemu-img check of %s: %q", path, out)
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

	DescribeTable("keeps every piece the guest made durable when it crashes while writing, and the overlay checks clean",
		func(ctx SpecContext, vm string, targetOf func(ctx context.Context) string, crash func(ctx context.Context, vm string)) {
			deleteVM(ctx, vm)
			target := targetOf(ctx)
			Expect(apply(ctx, linuxVMYAML(vm, "Manual", "pieces=all", persistent(vm+"-target")))).To(Succeed())
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIReady(ctx, vm)
			before := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Published) >= 3 })
			Expect(before.Golden).To(Equal("OK"))

			crash(ctx, vm)
			Eventually(func() (string, error) {
				return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "--ignore-not-found", "-o", "jsonpath={.status.phase}")
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(BeElementOf("Failed", "Succeeded", ""))
			// QEMU is gone: the overlay is as the crash left it.
			afterCrash := checkImage(ctx, target)

			// The next boot only reads back what was published.
			Expect(kubectl(ctx, "-n", namespace, "patch", "vm", vm, "--type=merge",
				"-p", `{"spec":{"template":{"spec":{"domain":{"firmware":{"serial":"pieces=0"}}}}}}`)).Error().ToNot(HaveOccurred())
			Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
			waitVMIReady(ctx, vm)
			after := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Done })
			Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
			waitVMIGone(ctx, vm)
			afterReboot := checkImage(ctx, target)

			AddReportEntry("crash consistency", fmt.Sprintf(
				"published before the crash (at least): %d; verified after it: %d of %d listed; "+
					"qemu-img check after the crash: %d errors, %d corruptions, %d leaks; after the next boot: %d errors, %d corruptions, %d leaks",
				len(before.Published), after.Verified, after.Listed,
				afterCrash.CheckErrors, afterCrash.Corruptions, afterCrash.Leaks,
				afterReboot.CheckErrors, afterReboot.Corruptions, afterReboot.Leaks))
			Expect(after.Boot).To(Equal(2))
			Expect(after.Consistent()).To(BeTrue(), "the guest after the crash: %+v", after)
			Expect(after.Listed).To(BeNumerically(">=", len(before.Published)))
			for _, check := range []qemuImgCheck{afterCrash, afterReboot} {
				Expect(check.CheckErrors).To(BeZero())
				Expect(check.Corruptions).To(BeZero())
			}
			deleteVM(ctx, vm)
		},
		Entry("QEMU killed, on a Filesystem target claim", "crash-fs", func(ctx context.Context) string {
			return filepath.Join(emptyFilesystemClaim(ctx, "crash-fs-target", 512<<20), "disk.qcow2")
		}, killQEMU, SpecTimeout(25*time.Minute)),
		Entry("QEMU killed, on a Block-mode target claim", "crash-block", func(ctx context.Context) string {
			return blockClaim(ctx, "crash-block-target", 192<<20)
		}, killQEMU, SpecTimeout(25*time.Minute)),
		Entry("the virt-launcher pod deleted with no grace period, on a Filesystem target claim", "crash-pod", func(ctx context.Context) string {
			return filepath.Join(emptyFilesystemClaim(ctx, "crash-pod-target", 512<<20), "disk.qcow2")
		}, deletePod, SpecTimeout(25*time.Minute)),
	)
})
