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
}

// migrate live-migrates the VM with virtctl, waits until the migration
// ended and the source's launcher with it, and returns what the VMI says
// of it.
func migrate(ctx context.Context, vm string) migrationState {
	sourcePod := launcherPod(ctx, vm)
	Expect(virtctl(ctx, "-n", namespace, "migrate", vm)).Error().ToNot(HaveOccurred())
	var state migrationState
	Eventually(func(g Gomega) {
		// A false flag is left out: fields are separated, not split on
		// blanks.
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", `jsonpath={.status.migrationState.completed}`+
			`|{.status.migrationState.failed}|{.status.migrationState.sourceNode}|{.status.migrationState.targetNode}`+
			`|{.status.migrationMethod}`)
		g.Expect(err).ToNot(HaveOccurred())
		f := strings.Split(out, "|")
		g.Expect(f).To(HaveLen(5), "the VMI's migrationState: %q", out)
		state = migrationState{f[0] == "true", f[1] == "true", f[2], f[3], f[4]}
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
	// to the other's.
	It("moves a containerDisk VM to the other node, where its guest goes on", func(ctx SpecContext) {
		const vm = "migrate-cd"
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=2,hotplug",
			"containerDisk: {image: "+linuxDiskImage+", imagePullPolicy: Never}"))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
		Expect(waitLinuxDone(ctx, vm).Published).To(HaveLen(2))
		source := vmiNode(ctx, vm)

		state := migrate(ctx, vm)
		Expect(state.failed).To(BeFalse(), "%+v", state)
		Expect(state.method).To(Equal("BlockMigration"))
		Expect(state.sourceNode).To(Equal(source))
		Expect(state.targetNode).ToNot(Equal(source))
		Expect(vmiNode(ctx, vm)).To(Equal(state.targetNode))

		// The guest, now on the target, still runs its program: it writes
		// to a disk plugged in there, and says so on the target's console.
		addImage(ctx, vm, "scratch", "--writable")
		status := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Writes) > 0 })
		Expect(status.Writes[0].Failed).To(BeFalse(), "the guest's write after the migration: %+v", status.Writes)
		Expect(status.Errors).To(BeEmpty())
	})

	// Shared storage: the disk is not copied, QEMU hands it over. The
	// guest writes before the migration, answers on the target, and reads
	// back what it wrote at its next boot.
	DescribeTable("moves a VM whose disk is on a ReadWriteMany claim, the disk handed over, not copied",
		func(ctx SpecContext, vm string, disk func(ctx context.Context, name string)) {
			disk(ctx, vm)
			Expect(apply(ctx, linuxVMYAML(vm, "Always", "pieces=2,hotplug", "persistentVolumeClaim: {claimName: "+vm+"}"))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
			waitVMIReady(ctx, vm)
			Expect(waitLinuxDone(ctx, vm).Published).To(HaveLen(2))
			source := vmiNode(ctx, vm)

			state := migrate(ctx, vm)
			Expect(state.failed).To(BeFalse(), "%+v", state)
			Expect(state.method).To(Equal("LiveMigration"))
			Expect(state.targetNode).ToNot(Equal(source))
			Expect(vmiNode(ctx, vm)).To(Equal(state.targetNode))
			addImage(ctx, vm, "scratch", "--writable")
			Expect(waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Writes) > 0 }).Writes[0].Failed).To(BeFalse())

			// Two more pieces at the next boot, after reading back the
			// two written on the source.
			Expect(virtctl(ctx, "-n", namespace, "restart", vm)).Error().ToNot(HaveOccurred())
			again := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return s.Boot == 2 && s.Done })
			Expect(again.Consistent()).To(BeTrue(), "%+v", again)
			Expect(again.Verified).To(Equal(2), "%+v", again)
		},
		Entry("Filesystem", "migrate-rwx-fs", func(ctx context.Context, name string) {
			guest, err := testenv.LinuxGuestImage(ctx)
			framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
			linuxDiskClaimWithAccess(ctx, name, 2*fileSize(guest), "ReadWriteMany")
		}),
		Entry("Block", "migrate-rwx-block", func(ctx context.Context, name string) {
			guest, err := testenv.LinuxGuestImage(ctx)
			framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
			dev := blockClaimWithAccess(ctx, name, fileSize(guest), "ReadWriteMany")
			Expect(exec.CommandContext(ctx, "dd", "if="+guest, "of="+dev, "bs=1M", "oflag=direct", "status=none").Run()).To(Succeed())
		}),
	)
})
