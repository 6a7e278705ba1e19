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
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

// The image a user would push: a raw disk under /disk/, owned by KubeVirt's
// qemu user, nothing else. The node has it imported, so nothing is pulled.
const (
	toolsImage  = "registry.e2e.test/tools-disk:v1"
	toolsVolume = "tools"
)

// toolsArchive builds the image as a docker archive and returns it with
// the SHA-256 of its disk.
func toolsArchive(dir string) (archive, digest string) {
	disk := filepath.Join(dir, "tools.img")
	content := bytes.Repeat([]byte("kubevirt-qcow2 hotplugged containerDisk\n"), 1<<16)
	Expect(os.WriteFile(disk, content, 0o644)).To(Succeed())
	img, err := ociimage.Build(ociimage.Spec{Files: []ociimage.File{
		{Path: "/disk/tools.img", Source: disk, Mode: 0o440, UID: 107, GID: 107},
	}})
	Expect(err).ToNot(HaveOccurred())
	archive = filepath.Join(dir, "tools-disk.tar")
	Expect(ociimage.WriteArchive(archive, toolsImage, img)).To(Succeed())
	sum := sha256.Sum256(content)
	return archive, hex.EncodeToString(sum[:])
}

// volumePhase is the phase of the VMI's volume, or "" while it has none.
func volumePhase(ctx context.Context, vm, volume string) (string, error) {
	return kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
		`jsonpath={.status.volumeStatus[?(@.name=="`+volume+`")].phase}`)
}

// attachmentPods are the names of the VM's hotplug attachment pods.
func attachmentPods(ctx context.Context) []string {
	out, err := kubectl(ctx, "-n", namespace, "get", "pods", "-l", "kubevirt.io=hotplug-disk", "-o", "jsonpath={.items[*].metadata.name}")
	Expect(err).ToNot(HaveOccurred())
	return strings.Fields(out)
}

// virsh runs virsh against the libvirt of the VM's launcher pod, whose
// non-root virtqemud listens on its own socket.
func virsh(ctx context.Context, vm string, args ...string) (string, error) {
	return kubectl(ctx, append([]string{"-n", namespace, "exec", launcherPod(ctx, vm), "-c", "compute", "--",
		"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock"}, args...)...)
}

// domainDisks lists the disks QEMU has, as libvirt in the launcher pod
// reports them.
func domainDisks(ctx context.Context, vm string) string {
	out, err := virsh(ctx, vm, "domblklist", namespace+"_"+vm)
	Expect(err).ToNot(HaveOccurred())
	return out
}

// inLauncher runs a command in the compute container of the VM's launcher.
func inLauncher(ctx context.Context, vm string, args ...string) (string, error) {
	return kubectl(ctx, append([]string{"-n", namespace, "exec", launcherPod(ctx, vm), "-c", "compute", "--"}, args...)...)
}

// addImage hotplugs the tools image with virtctl and waits until the
// volume is Ready in the VMI's status.
func addImage(ctx context.Context, vm, volume string, flags ...string) {
	args := append([]string{"-n", namespace, "addvolume", vm, "--image=" + toolsImage, "--volume-name=" + volume}, flags...)
	// virt-api reads the gates through an informer: until it has them,
	// the request is refused naming the gate.
	Eventually(func() error {
		_, err := virtctl(ctx, args...)
		return err
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	Eventually(func() (string, error) {
		return volumePhase(ctx, vm, volume)
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(time.Second).Should(Equal("Ready"))
}

// removeImage unplugs a volume with virtctl and waits until the VMI, the
// domain and the namespace's pods no longer have it.
func removeImage(ctx context.Context, vm, volume string) {
	_, err := virtctl(ctx, "-n", namespace, "removevolume", vm, "--volume-name="+volume)
	Expect(err).ToNot(HaveOccurred())
	Eventually(func() (string, error) {
		return volumePhase(ctx, vm, volume)
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(time.Second).Should(BeEmpty())
	Eventually(func() string { return domainDisks(ctx, vm) }).
		WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).ShouldNot(ContainSubstring(volume))
	Eventually(func() []string { return attachmentPods(ctx) }).
		WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeEmpty())
}

// mountOptions are the options of the mount at target in a mount table
// (/proc/mounts).
func mountOptions(table, target string) []string {
	for _, line := range strings.Split(table, "\n") {
		if fields := strings.Fields(line); len(fields) > 3 && fields[1] == target {
			return strings.Split(fields[3], ",")
		}
	}
	return nil
}

// nodeMounts lists the node's mount points.
func nodeMounts(ctx context.Context) []string {
	out, err := inNode(ctx, "findmnt", "-rn", "-o", "TARGET")
	Expect(err).ToNot(HaveOccurred())
	return strings.Split(out, "\n")
}

// openFiles counts the open files of the node's processes whose command
// line matches pattern; exactly one must match.
func openFiles(ctx context.Context, pattern string) int {
	pid, err := inNode(ctx, "pgrep", "-f", pattern)
	Expect(err).ToNot(HaveOccurred())
	Expect(strings.Fields(pid)).To(HaveLen(1), "processes matching %q", pattern)
	out, err := inNode(ctx, "ls", "/proc/"+pid+"/fd")
	Expect(err).ToNot(HaveOccurred())
	return len(strings.Fields(out))
}

var _ = Describe("containerDisk hotplug with virtctl", Ordered, func() {
	const vm = "hotplug-cd"
	var diskDigest string
	image := func(volume string) string { return "/var/run/kubevirt/hotplug-disks/" + volume + ".img" }

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugVolumes"},`+
			`{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugContainerDisk"}]`)
		var archive string
		archive, diskDigest = toolsArchive(GinkgoT().TempDir())
		Expect(run(ctx, clusterScript, "import", archive)).To(Succeed())

		goldenFilesystem(ctx, "hotplug-golden")
		Expect(apply(ctx, vmYAML(vm, "Always", `
overlay:
  backingPVC: {claimName: hotplug-golden}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
	})

	It("attaches the image to the running VM, read-only and unchanged", func(ctx SpecContext) {
		addImage(ctx, vm, toolsVolume)
		Expect(attachmentPods(ctx)).To(HaveLen(1))
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring(image(toolsVolume)))
		sum, err := inLauncher(ctx, vm, "sha256sum", image(toolsVolume))
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(sum)).To(HaveExactElements(diskDigest, image(toolsVolume)))
		// The bind mount is read-only in the launcher pod: QEMU cannot
		// write the image whatever the guest does.
		mounts, err := inLauncher(ctx, vm, "cat", "/proc/self/mounts")
		Expect(err).ToNot(HaveOccurred())
		target, err := inLauncher(ctx, vm, "realpath", image(toolsVolume)) // /var/run is a link
		Expect(err).ToNot(HaveOccurred())
		Expect(mountOptions(mounts, target)).To(ContainElement("ro"), "mounts:\n%s", mounts)
	})

	It("detaches it again, leaving no pod and no mount on the node", func(ctx SpecContext) {
		removeImage(ctx, vm, toolsVolume)
		Expect(nodeMounts(ctx)).ToNot(ContainElement(ContainSubstring("hotplug-disks/" + toolsVolume)))
	})

	It("gives a writable image an overlay that takes the writes and goes on removal", func(ctx SpecContext) {
		const scratch = "scratch"
		overlay := "/var/run/kubevirt-ephemeral-disks/hotplug-overlay-data/" + scratch + "/disk.qcow2"
		addImage(ctx, vm, scratch, "--writable")
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring(overlay))

		// A write through the disk's device, as the guest's would be, and
		// a flush so that the overlay's tables on disk show it. qemu-io
		// prints to QEMU's output, not the monitor's: the monitor answers
		// only errors.
		for _, cmd := range []string{"write -P 0x5a 0 1M", "flush"} {
			out, err := virsh(ctx, vm, "qemu-monitor-command", namespace+"_"+vm, "--hmp",
				`qemu-io -d ua-`+scratch+` "`+cmd+`"`)
			Expect(err).ToNot(HaveOccurred())
			Expect(out).To(BeEmpty())
		}
		out, err := inLauncher(ctx, vm, "qemu-img", "map", "-U", "--output=json", overlay)
		Expect(err).ToNot(HaveOccurred())
		Expect(out).To(ContainSubstring(`"start": 0, "length": 1048576, "depth": 0`), "the write is in the overlay")
		_, err = inLauncher(ctx, vm, "qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -P 0x5a 0 1M", overlay)
		Expect(err).ToNot(HaveOccurred(), "the overlay holds what was written")
		sum, err := inLauncher(ctx, vm, "sha256sum", image(scratch))
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(sum)).To(HaveExactElements(diskDigest, image(scratch)), "the image is unchanged")

		removeImage(ctx, vm, scratch)
		_, err = inLauncher(ctx, vm, "stat", filepath.Dir(overlay))
		Expect(err).To(MatchError(ContainSubstring("No such file or directory")))
	})

	It("leaves no mount, open file or pod behind after 20 add/remove cycles", func(ctx SpecContext) {
		const cycles = 20
		handler, qemu := "^virt-handler ", "guest="+namespace+"_"+vm
		cycle := func() {
			addImage(ctx, vm, toolsVolume)
			removeImage(ctx, vm, toolsVolume)
		}
		cycle() // caches and connections made on the first use are no leak
		mounts, handlerFiles, qemuFiles := nodeMounts(ctx), openFiles(ctx, handler), openFiles(ctx, qemu)
		pods, err := kubectl(ctx, "get", "pods", "-A", "-o", "name")
		Expect(err).ToNot(HaveOccurred())

		for range cycles {
			cycle()
		}
		fmt.Printf("after %d cycles: node mounts %d -> %d, virt-handler files %d -> %d, QEMU files %d -> %d\n",
			cycles, len(mounts), len(nodeMounts(ctx)), handlerFiles, openFiles(ctx, handler), qemuFiles, openFiles(ctx, qemu))
		// Pods of earlier specs may still be going away: nothing new is
		// the measure, not the same count.
		Expect(nodeMounts(ctx)).To(HaveEach(BeElementOf(mounts)), "mounts added by the cycles")
		Expect(openFiles(ctx, qemu)).To(Equal(qemuFiles))
		// virt-handler's connections to the API server and to launchers
		// come and go; a leak would add at least one file per cycle.
		Expect(openFiles(ctx, handler)).To(BeNumerically("<", handlerFiles+cycles/2))
		after, err := kubectl(ctx, "get", "pods", "-A", "-o", "name")
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(after)).To(HaveEach(BeElementOf(strings.Fields(pods))), "pods added by the cycles")
	})
})
