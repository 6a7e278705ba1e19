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

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
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
func toolsArchive(ctx context.Context, dir string) (archive, digest string) {
	disk := filepath.Join(dir, "tools.img")
	content := bytes.Repeat([]byte("kubevirt-qcow2 hotplugged containerDisk\n"), 1<<16)
	Expect(os.WriteFile(disk, content, 0o644)).To(Succeed())
	img, err := ociimage.Build(ctx, ociimage.Spec{Files: []ociimage.File{
		{Path: "/disk/tools.img", Source: disk, Mode: 0o440, UID: 107, GID: 107},
	}})
	Expect(err).ToNot(HaveOccurred())
	archive = filepath.Join(dir, "tools-disk.tar")
	Expect(ociimage.WriteArchive(ctx, archive, toolsImage, img)).To(Succeed())
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

// removeVolume unplugs a volume with virtctl and waits until the VMI, the
// domain and the attachment pods no longer have it.
func removeVolume(ctx context.Context, vm, volume string) {
	_, err := virtctl(ctx, "-n", namespace, "removevolume", vm, "--volume-name="+volume)
	Expect(err).ToNot(HaveOccurred())
	Eventually(func() (string, error) {
		return volumePhase(ctx, vm, volume)
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(time.Second).Should(BeEmpty())
	Eventually(func() string { return domainDisks(ctx, vm) }).
		WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).ShouldNot(ContainSubstring(volume))
	// An attachment pod has an emptyDir named after each containerDisk it
	// serves.
	Eventually(func() ([]string, error) {
		out, err := kubectl(ctx, "-n", namespace, "get", "pods", "-l", "kubevirt.io=hotplug-disk", "-o", "jsonpath={.items[*].spec.volumes[*].name}")
		return strings.Fields(out), err
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).ShouldNot(ContainElement(volume))
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

// The VM's Linux guest writes to every disk plugged in (hack/guest/guest-test,
// order hotplug): what it wrote is checked where it must land, or must not.
var _ = Describe("containerDisk hotplug with virtctl", Ordered, Label(linuxGuestLabel), func() {
	const vm = "hotplug-cd"
	var diskDigest string
	image := func(volume string) string { return "/var/run/kubevirt/hotplug-disks/" + volume + ".img" }

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugVolumes"},`+
			`{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugContainerDisk"}]`)
		var archive string
		archive, diskDigest = toolsArchive(ctx, GinkgoT().TempDir())
		Expect(run(ctx, clusterScript, "import", archive)).To(Succeed())

		linuxGolden(ctx, "hotplug-golden")
		Expect(apply(ctx, linuxVMYAML(vm, "Always", "hotplug", `
overlay:
  backingPVC: {claimName: hotplug-golden}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
		waitLinuxDone(ctx, vm)
	})

	// nextDiskWrite waits for the guest's write to the disk plugged in
	// after its first done writes.
	nextDiskWrite := func(ctx context.Context, done int) testenv.DiskWrite {
		status := waitLinuxGuest(ctx, vm, func(s testenv.LinuxGuestStatus) bool { return len(s.Writes) > done })
		return status.Writes[done]
	}
	diskWrites := func(ctx context.Context) int {
		return len(waitLinuxGuest(ctx, vm, func(testenv.LinuxGuestStatus) bool { return true }).Writes)
	}

	It("attaches the image to the running VM, read-only and unchanged", func(ctx SpecContext) {
		done := diskWrites(ctx)
		addImage(ctx, vm, toolsVolume)
		Expect(attachmentPods(ctx)).To(HaveLen(1))
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring(image(toolsVolume)))
		Expect(nextDiskWrite(ctx, done)).To(Equal(testenv.DiskWrite{Device: "sda", Failed: true}), "the guest's write is refused")
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
		removeVolume(ctx, vm, toolsVolume)
		Eventually(func() []string { return attachmentPods(ctx) }).
			WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeEmpty())
		Expect(nodeMounts(ctx)).ToNot(ContainElement(ContainSubstring("hotplug-disks/" + toolsVolume)))
	})

	It("gives a writable image an overlay that takes the writes and goes on removal", func(ctx SpecContext) {
		const scratch = "scratch"
		overlay := "/var/run/kubevirt-ephemeral-disks/hotplug-overlay-data/" + scratch + "/disk.qcow2"
		done := diskWrites(ctx)
		addImage(ctx, vm, scratch, "--writable")
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring(overlay))

		// The guest's write, direct and flushed: the overlay's tables on
		// disk show it, and its content reads back through the chain.
		write := nextDiskWrite(ctx, done)
		Expect(write).To(Equal(testenv.DiskWrite{Device: "sda", Bytes: 1 << 20, SHA256: write.SHA256}))
		out, err := inLauncher(ctx, vm, "qemu-img", "map", "-U", "--output=json", overlay)
		Expect(err).ToNot(HaveOccurred())
		Expect(out).To(ContainSubstring(`"start": 0, "length": 1048576, "depth": 0`), "the write is in the overlay")
		const copied = "/var/run/kubevirt-private/scratch.raw"
		sum, err := inLauncher(ctx, vm, "sh", "-c", "qemu-img convert -U -f qcow2 -O raw "+overlay+" "+copied+
			" && head -c 1048576 "+copied+" | sha256sum && rm "+copied)
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(sum)).To(HaveExactElements(write.SHA256, "-"), "the overlay holds what the guest wrote")
		sum, err = inLauncher(ctx, vm, "sha256sum", image(scratch))
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(sum)).To(HaveExactElements(diskDigest, image(scratch)), "the image is unchanged")

		removeVolume(ctx, vm, scratch)
		_, err = inLauncher(ctx, vm, "stat", filepath.Dir(overlay))
		Expect(err).To(MatchError(ContainSubstring("No such file or directory")))
	})

	It("leaves no mount, open file or pod behind after 20 add/remove cycles", func(ctx SpecContext) {
		const cycles = 20
		handler, qemu := "^virt-handler ", "guest="+namespace+"_"+vm
		cycle := func() {
			addImage(ctx, vm, toolsVolume)
			removeVolume(ctx, vm, toolsVolume)
		}
		cycle() // caches and connections made on the first use are no leak
		mounts, handlerFiles, qemuFiles := nodeMounts(ctx), openFiles(ctx, handler), openFiles(ctx, qemu)
		pods, err := kubectl(ctx, "get", "pods", "-A", "-o", "name")
		Expect(err).ToNot(HaveOccurred())

		for range cycles {
			cycle()
		}
		// The last attachment pod's object is gone once kubelet stopped its
		// containers; its sandbox and volume mounts go a moment later. A
		// leak never settles; pods of earlier specs may still be going
		// away, so nothing new is the measure, not the same count.
		Eventually(func() []string { return nodeMounts(ctx) }).WithContext(ctx).WithTimeout(2*time.Minute).
			WithPolling(2*time.Second).Should(HaveEach(BeElementOf(mounts)), "mounts added by the cycles")
		fmt.Printf("after %d cycles: node mounts %d -> %d, virt-handler files %d -> %d, QEMU files %d -> %d\n",
			cycles, len(mounts), len(nodeMounts(ctx)), handlerFiles, openFiles(ctx, handler), qemuFiles, openFiles(ctx, qemu))
		Expect(openFiles(ctx, qemu)).To(Equal(qemuFiles))
		// virt-handler's connections to the API server and to launchers
		// come and go; a leak would add at least one file per cycle.
		Expect(openFiles(ctx, handler)).To(BeNumerically("<", handlerFiles+cycles/2))
		after, err := kubectl(ctx, "get", "pods", "-A", "-o", "name")
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(after)).To(HaveEach(BeElementOf(strings.Fields(pods))), "pods added by the cycles")
	})
})

// restartVirtHandler deletes virt-handler's pod and waits until its
// replacement alone runs and is ready.
func restartVirtHandler(ctx context.Context) {
	const selector = "kubevirt.io=virt-handler"
	old, err := kubectl(ctx, "-n", "kubevirt", "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}")
	Expect(err).ToNot(HaveOccurred())
	_, err = kubectl(ctx, "-n", "kubevirt", "delete", "pods", "-l", selector, "--wait=false")
	Expect(err).ToNot(HaveOccurred())
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", "kubevirt", "get", "pods", "-l", selector, "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		g.Expect(err).ToNot(HaveOccurred())
		fields := strings.Fields(out)
		g.Expect(fields).To(HaveLen(2))
		g.Expect(fields[0]).ToNot(Equal(old))
		g.Expect(fields[1]).To(Equal("True"))
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
}

// imageMounts counts the node's mounts of the VM's hotplugged image of volume.
func imageMounts(ctx context.Context, volume string) int {
	var n int
	for _, mount := range nodeMounts(ctx) {
		if strings.HasSuffix(mount, "/hotplug-disks/"+volume+".img") {
			n++
		}
	}
	return n
}

var _ = Describe("containerDisk hotplug under faults", Ordered, Label(bootSectorGuestLabel), func() {
	const (
		vm    = "hotplug-faults"
		claim = "faults-data"
	)
	var launcher string

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugVolumes"},`+
			`{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugContainerDisk"}]`)
		archive, _ := toolsArchive(ctx, GinkgoT().TempDir())
		Expect(run(ctx, clusterScript, "import", archive)).To(Succeed())
		goldenFilesystem(ctx, "faults-golden")
		blockClaim(ctx, claim, 16<<20)
		Expect(apply(ctx, vmYAML(vm, "Always", `
overlay:
  backingPVC: {claimName: faults-golden}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
		launcher = launcherPod(ctx, vm)
	})

	// The VM runs on in the same pod whatever happened to the volumes.
	AfterEach(func(ctx SpecContext) {
		Expect(launcherPod(ctx, vm)).To(Equal(launcher))
		waitVMIReady(ctx, vm)
	})

	It("keeps an attached image when its attachment pod is deleted", func(ctx SpecContext) {
		addImage(ctx, vm, toolsVolume)
		pods := attachmentPods(ctx)
		Expect(pods).To(HaveLen(1))
		_, err := kubectl(ctx, "-n", namespace, "delete", "pod", pods[0])
		Expect(err).ToNot(HaveOccurred())

		// virt-controller starts another attachment pod; the image QEMU has
		// open stays attached and mounted once.
		Eventually(func(g Gomega) {
			g.Expect(attachmentPods(ctx)).To(HaveLen(1))
			g.Expect(attachmentPods(ctx)).ToNot(ContainElement(pods[0]))
			g.Expect(volumePhase(ctx, vm, toolsVolume)).To(Equal("Ready"))
		}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
		Expect(domainDisks(ctx, vm)).To(ContainSubstring("hotplug-disks/" + toolsVolume + ".img"))
		Expect(imageMounts(ctx, toolsVolume)).To(Equal(1))
		removeVolume(ctx, vm, toolsVolume)
		Expect(imageMounts(ctx, toolsVolume)).To(BeZero())
	})

	It("attaches an image whose add was under way when virt-handler's pod went", func(ctx SpecContext) {
		_, err := virtctl(ctx, "-n", namespace, "addvolume", vm, "--image="+toolsImage, "--volume-name="+toolsVolume)
		Expect(err).ToNot(HaveOccurred())
		restartVirtHandler(ctx)
		Eventually(func() (string, error) {
			return volumePhase(ctx, vm, toolsVolume)
		}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(time.Second).Should(Equal("Ready"))
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring("hotplug-disks/" + toolsVolume + ".img"))
		Expect(imageMounts(ctx, toolsVolume)).To(Equal(1))
	})

	It("keeps it attached when virt-handler's pod goes again, and still removes it", func(ctx SpecContext) {
		restartVirtHandler(ctx)
		Consistently(func() (string, error) {
			return volumePhase(ctx, vm, toolsVolume)
		}).WithContext(ctx).WithTimeout(20 * time.Second).WithPolling(2 * time.Second).Should(Equal("Ready"))
		Expect(domainDisks(ctx, vm)).To(ContainSubstring("hotplug-disks/" + toolsVolume + ".img"))
		Expect(imageMounts(ctx, toolsVolume)).To(Equal(1))
		removeVolume(ctx, vm, toolsVolume)
		Expect(imageMounts(ctx, toolsVolume)).To(BeZero())
	})

	It("says why an image cannot be pulled, keeps the claims, and takes a good image later", func(ctx SpecContext) {
		_, err := virtctl(ctx, "-n", namespace, "addvolume", vm, "--volume-name="+claim)
		Expect(err).ToNot(HaveOccurred())
		Eventually(func() (string, error) {
			return volumePhase(ctx, vm, claim)
		}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(time.Second).Should(Equal("Ready"))

		const missing = "missing"
		_, err = virtctl(ctx, "-n", namespace, "addvolume", vm, "--image=registry.e2e.test/missing-disk:v1", "--volume-name="+missing)
		Expect(err).ToNot(HaveOccurred())
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
				`jsonpath={.status.volumeStatus[?(@.name=="`+missing+`")].reason}: {.status.volumeStatus[?(@.name=="`+missing+`")].message}`)
			g.Expect(err).ToNot(HaveOccurred())
			g.Expect(out).To(MatchRegexp(`^(ErrImagePull|ImagePullBackOff): Image registry.e2e.test/missing-disk:v1 of volume missing: `))
		}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
		Expect(volumePhase(ctx, vm, claim)).To(Equal("Ready"))
		Expect(domainDisks(ctx, vm)).To(ContainSubstring("hotplug-disks/" + claim))

		_, err = virtctl(ctx, "-n", namespace, "removevolume", vm, "--volume-name="+missing)
		Expect(err).ToNot(HaveOccurred())
		addImage(ctx, vm, toolsVolume)
		Eventually(func() string { return domainDisks(ctx, vm) }).
			WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(ContainSubstring("hotplug-disks/" + toolsVolume + ".img"))
		Expect(volumePhase(ctx, vm, claim)).To(Equal("Ready"))

		removeVolume(ctx, vm, toolsVolume)
		_, err = virtctl(ctx, "-n", namespace, "removevolume", vm, "--volume-name="+claim)
		Expect(err).ToNot(HaveOccurred())
		Eventually(func() []string { return attachmentPods(ctx) }).
			WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeEmpty())
	})
})
