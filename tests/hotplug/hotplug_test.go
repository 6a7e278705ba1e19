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

package hotplug_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/hotplug"
)

const (
	volume = "tools"
	domain = "vm1"
	// alias is the device name the launcher's converter gives the disk.
	alias = "ua-" + volume
)

var _ = Describe("containerDisk hotplug on a node", Ordered, func() {
	var (
		lv   *testenv.Libvirtd
		node *hotplug.Node
		pods int
	)

	BeforeAll(func(ctx SpecContext) {
		lv = framework.StartSuiteLibvirtd(ctx)

		root := tempDir()
		var err error
		node, err = hotplug.NewNode(tools, testenv.Binary("container-disk"), root, lv.SharedDir())
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(node.Close)
		DeferCleanup(func() { Expect(removeUnmounted(filepath.Dir(node.KubeletPods))).To(Succeed()) })
		Expect(hotplug.StartDomain(ctx, lv, root, domain)).To(Succeed())
	}, NodeTimeout(3*time.Minute))

	// newPod returns the UID of a new attachment pod: each add creates one.
	// A UUID, as the kubelet names pod directories: with it the containers'
	// socket paths pass the 107 bytes a socket address holds, as they do on
	// a node, and virt-handler and the harness must still reach them.
	newPod := func() string {
		pods++
		return fmt.Sprintf("a77ac400-0000-4000-8000-%012d", pods)
	}

	layer := func(ctx context.Context, kind hotplug.ImageKind) *hotplug.ImageLayer {
		GinkgoHelper()
		l, err := hotplug.NewImageLayer(ctx, tempDir(), kind)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(l.Close(ctx)).To(Succeed()) })
		return l
	}

	start := func(ctx context.Context, pod string, l *hotplug.ImageLayer) *hotplug.Container {
		GinkgoHelper()
		c, err := node.StartContainer(ctx, pod, volume, l)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(c.Stop(ctx)).To(Succeed()) })
		return c
	}

	// expectNothingLeft checks what a removal must leave: no mount under
	// the kubelet pods directory on the host or in libvirtd's namespace, no
	// mount record, an empty hotplug-disks directory, no disk in the domain.
	expectNothingLeft := func(ctx context.Context) {
		GinkgoHelper()
		Expect(mountsUnder(testenv.MountPoints, node.KubeletPods)).To(BeEmpty())
		Expect(mountsUnder(lv.Mounts, node.KubeletPods)).To(BeEmpty())
		Expect(os.ReadDir(node.StateDir)).To(BeEmpty(), "mount records")
		Expect(os.ReadDir(node.LauncherHotplugDir())).To(BeEmpty())
		disks, err := hotplug.DomainDisks(ctx, lv, domain)
		Expect(err).ToNot(HaveOccurred())
		Expect(disks).To(HaveLen(1), "only the boot disk")
	}

	// teardown unmounts whatever virt-handler recorded for the VMI, as when
	// the VMI goes: after a failure, nothing stays mounted.
	teardown := func(ctx SpecContext) {
		_, err := node.Unmount(ctx, hotplug.VMI(hotplugPhaseAttached), true)
		Expect(err).ToNot(HaveOccurred())
	}

	// remove does what a removal of the volume does on the node: the
	// launcher detaches the disk, virt-handler unmounts the volume gone from
	// the spec, the attachment pod goes.
	remove := func(ctx context.Context, disk string, c *hotplug.Container) hotplug.Report {
		GinkgoHelper()
		Expect(hotplug.Detach(ctx, lv, domain, disk)).To(Succeed())
		Eventually(func() ([]libvirtxml.DomainDisk, error) { return hotplug.DomainDisks(ctx, lv, domain) }).
			WithContext(ctx).Should(HaveLen(1))
		r, err := node.Unmount(ctx, hotplug.VMI(hotplugPhaseAttached), false)
		Expect(err).ToNot(HaveOccurred())
		Expect(c.Stop(ctx)).To(Succeed())
		Expect(c.Socket).ToNot(BeAnExistingFile())
		return r
	}

	DescribeTable("attaches the image read-only with its content, and removal leaves nothing behind",
		func(ctx SpecContext, kind hotplug.ImageKind, format string) {
			l := layer(ctx, kind)
			imageBefore := checksum(l.Image)
			pod := newPod()
			c := start(ctx, pod, l)
			Expect(len(c.Socket)).To(BeNumerically(">", 107), "a socket path no socket address holds")
			v := hotplug.Volume{Name: volume, AttachPodUID: pod}

			By("virt-handler finding the socket and mounting the image")
			r, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, v))
			Expect(err).ToNot(HaveOccurred())
			DeferCleanup(teardown)
			Expect(r.Mounted).To(Equal(map[string]bool{volume: true}))
			Expect(r.VolumeStatus).To(HaveLen(1))
			Expect(r.VolumeStatus[0].ContainerDiskVolume).ToNot(BeNil())
			Expect(r.VolumeStatus[0].ContainerDiskVolume.Checksum).To(Equal(imageBefore))

			Expect(r.DeviceRules).To(BeEmpty(), "an image is never a device")
			target := filepath.Join(node.LauncherHotplugDir(), volume+".img")
			for _, mounts := range []func() ([]testenv.Mount, error){testenv.MountPoints, lv.Mounts} {
				m := mountsUnder(mounts, node.KubeletPods)
				Expect(m).To(HaveLen(1))
				Expect(m[0].MountPoint).To(Equal(target))
				Expect(m[0].Root).To(Equal("/disk/disk.img"), "the image in the container's root filesystem")
				Expect(m[0].FSType).To(Equal("overlay"))
			}

			By("virt-launcher probing the image and converting the volume")
			disks, err := node.Disks(ctx, hotplug.VMI(hotplugPhaseMounted, v))
			Expect(err).ToNot(HaveOccurred())
			Expect(disks).To(HaveLen(1))
			disk := libvirtxml.DomainDisk{}
			Expect(disk.Unmarshal(disks[0])).To(Succeed())
			Expect(disk.ReadOnly).ToNot(BeNil())
			Expect(disk.Driver.Type).To(Equal(format))
			Expect(disk.Target.Bus).To(Equal("scsi"))
			Expect(disk.BackingStore).To(BeNil(), "no overlay")
			Expect(disk.Source.File.File).To(Equal(target))

			By("hot-attaching the disk to the running domain")
			Expect(hotplug.Attach(ctx, lv, domain, disks[0])).To(Succeed())
			attached, err := hotplug.DomainDisks(ctx, lv, domain)
			Expect(err).ToNot(HaveOccurred())
			Expect(attached).To(HaveLen(2))
			Expect(attached[1].Alias.Name).To(Equal(alias))

			By("reading the image's content through the attached device")
			device, err := hotplug.QueryDevice(ctx, lv, domain, alias)
			Expect(err).ToNot(HaveOccurred())
			Expect(device.Inserted.ReadOnly).To(BeTrue(), "QEMU opened the disk read-only")
			Expect(hotplug.CompareDeviceContent(ctx, lv, domain, alias, lv.SharedDir(), l.Content)).To(Succeed())

			By("removing the volume")
			r = remove(ctx, disks[0], c)
			Expect(r.DeviceRules).To(BeEmpty())
			expectNothingLeft(ctx)
			Expect(checksum(l.Image)).To(Equal(imageBefore), "the image is unchanged")
		},
		Entry("a raw file image", SpecTimeout(2*time.Minute), hotplug.RawFile, "raw"),
		Entry("a qcow2 file image", SpecTimeout(2*time.Minute), hotplug.QCOW2File, "qcow2"),
	)

	It("gives a writable volume an overlay that takes the writes and goes on unplug, the image unchanged", func(ctx SpecContext) {
		l := layer(ctx, hotplug.RawFile)
		imageBefore := checksum(l.Image)
		pod := newPod()
		c := start(ctx, pod, l)
		v := hotplug.Volume{Name: volume, AttachPodUID: pod, Writable: true}
		_, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, v))
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(teardown)

		disks, err := node.Disks(ctx, hotplug.VMI(hotplugPhaseMounted, v))
		Expect(err).ToNot(HaveOccurred())
		Expect(disks).To(HaveLen(1))
		disk := libvirtxml.DomainDisk{}
		Expect(disk.Unmarshal(disks[0])).To(Succeed())
		overlayDir := filepath.Join(node.LauncherEphemeralDir(), "hotplug-overlay-data", volume)
		Expect(disk.ReadOnly).To(BeNil())
		Expect(disk.Driver.Type).To(Equal("qcow2"))
		Expect(disk.Source.File.File).To(Equal(filepath.Join(overlayDir, "disk.qcow2")))

		image := filepath.Join(node.LauncherHotplugDir(), volume+".img")
		Expect(disk.BackingStore).ToNot(BeNil())
		Expect(disk.BackingStore.Source.File.File).To(Equal(image))

		Expect(hotplug.Attach(ctx, lv, domain, disks[0])).To(Succeed())
		attached, err := hotplug.DomainDisks(ctx, lv, domain)
		Expect(err).ToNot(HaveOccurred())
		Expect(attached).To(HaveLen(2))
		Expect(attached[1].BackingStore).ToNot(BeNil(), "libvirt keeps the backingStore of the attached disk")
		Expect(attached[1].BackingStore.Source.File).ToNot(BeNil())
		Expect(attached[1].BackingStore.Source.File.File).To(Equal(image))
		Expect(attached[1].BackingStore.Format.Type).To(Equal("raw"))
		device, err := hotplug.QueryDevice(ctx, lv, domain, alias)
		Expect(err).ToNot(HaveOccurred())
		Expect(device.Inserted.ReadOnly).To(BeFalse())
		Expect(device.Inserted.Image.BackingImage).ToNot(BeNil(), "QEMU opened the overlay over the image")
		Expect(device.Inserted.Image.BackingImage.Filename).To(Equal(image), "the backing libvirt named, not the path in the overlay's header")

		By("writing through the attached device")
		const written = 0x7a
		_, err = lv.HMP(ctx, domain, fmt.Sprintf(`qemu-io -d %s "write -P 0x%x 0 %d"`, alias, written, hotplug.RegionSize))
		Expect(err).ToNot(HaveOccurred())
		want := filepath.Join(tempDir(), "want.raw")
		content, err := os.ReadFile(l.Content)
		Expect(err).ToNot(HaveOccurred())
		copy(content, bytes.Repeat([]byte{written}, hotplug.RegionSize))
		Expect(os.WriteFile(want, content, 0o644)).To(Succeed())
		Expect(hotplug.CompareDeviceContent(ctx, lv, domain, alias, lv.SharedDir(), want)).To(Succeed())
		Expect(checksum(l.Image)).To(Equal(imageBefore), "the writes are in the overlay")

		By("unplugging")
		Expect(hotplug.Detach(ctx, lv, domain, disks[0])).To(Succeed())
		Eventually(func() ([]libvirtxml.DomainDisk, error) { return hotplug.DomainDisks(ctx, lv, domain) }).
			WithContext(ctx).Should(HaveLen(1))
		Expect(node.UnplugOverlays(ctx, hotplug.VMI(hotplugPhaseAttached))).To(Succeed())
		Expect(overlayDir).ToNot(BeAnExistingFile(), "the overlay is gone")
		_, err = node.Unmount(ctx, hotplug.VMI(hotplugPhaseAttached), false)
		Expect(err).ToNot(HaveOccurred())
		Expect(c.Stop(ctx)).To(Succeed())
		expectNothingLeft(ctx)
		Expect(checksum(l.Image)).To(Equal(imageBefore))
	}, SpecTimeout(2*time.Minute))

	// add does what adding the volume does on the node and returns the
	// attached disk's XML: the attachment pod's container serves the image,
	// virt-handler mounts it, the launcher converts and attaches it.
	add := func(ctx context.Context, l *hotplug.ImageLayer) (*hotplug.Container, string) {
		GinkgoHelper()
		pod := newPod()
		c := start(ctx, pod, l)
		v := hotplug.Volume{Name: volume, AttachPodUID: pod}
		_, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, v))
		Expect(err).ToNot(HaveOccurred())
		disks, err := node.Disks(ctx, hotplug.VMI(hotplugPhaseMounted, v))
		Expect(err).ToNot(HaveOccurred())
		Expect(disks).To(HaveLen(1))
		Expect(hotplug.Attach(ctx, lv, domain, disks[0])).To(Succeed())
		return c, disks[0]
	}

	It("adds and removes a volume 50 times without leaking mounts, descriptors or processes", func(ctx SpecContext) {
		const cycles = 50
		l := layer(ctx, hotplug.RawFile)
		DeferCleanup(teardown)

		type snapshot struct {
			libvirtdFDs, qemuFDs int
			libvirtd             []int
		}
		take := func() snapshot {
			GinkgoHelper()
			pids, err := lv.Processes()
			Expect(err).ToNot(HaveOccurred())
			Expect(pids).To(HaveLen(2), "libvirtd and the domain's QEMU")
			qemu := pids[0]
			if qemu == lv.Pid() {
				qemu = pids[1]
			}
			return snapshot{libvirtdFDs: fdCount(lv.Pid()), qemuFDs: fdCount(qemu), libvirtd: pids}
		}

		var baseline snapshot
		for i := 0; i < cycles; i++ {
			c, disk := add(ctx, l)
			started := fdCount(c.Pid())
			Expect(hotplug.CompareDeviceContent(ctx, lv, domain, alias, lv.SharedDir(), l.Content)).To(Succeed(), "cycle %d", i)
			Expect(fdCount(c.Pid())).To(Equal(started), "container-disk closes every connection (cycle %d)", i)
			remove(ctx, disk, c)
			expectNothingLeft(ctx)
			Expect(node.Processes()).To(BeEmpty(), "nothing left in the node's PID namespace (cycle %d)", i)
			if i == 0 {
				// The first attach sets up what QEMU keeps for the
				// controller; later cycles must come back to it.
				baseline = take()
			}
		}
		Eventually(take).WithContext(ctx).Should(Equal(baseline))
		Expect(zombieChildren()).To(BeEmpty())
	}, SpecTimeout(15*time.Minute))

	DescribeTable("refuses bad input with an error naming it, leaving nothing mounted",
		func(ctx SpecContext, kind hotplug.ImageKind, path string, breakSocket func(context.Context, *hotplug.Container), want ...string) {
			l := layer(ctx, kind)
			pod := newPod()
			c := start(ctx, pod, l)
			DeferCleanup(teardown)
			if breakSocket != nil {
				breakSocket(ctx, c)
			}

			_, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: pod, Path: path}))
			Expect(err).To(HaveOccurred())
			for _, w := range want {
				Expect(err.Error()).To(ContainSubstring(w))
			}
			Expect(mountsUnder(testenv.MountPoints, node.KubeletPods)).To(BeEmpty())
			Expect(os.ReadDir(node.StateDir)).To(BeEmpty(), "no mount record")
			Expect(os.ReadDir(node.LauncherHotplugDir())).To(BeEmpty())
		},
		// A device node in an image names a node's device by its numbers:
		// here a loop device stands for the node's first disk.
		Entry("an image whose disk is a device node", SpecTimeout(time.Minute), hotplug.BlockDevice, "", nil,
			"containerDisk "+volume+" is not a regular file", "device cgroup rules set: 0"),
		Entry("an image with no file under /disk", SpecTimeout(time.Minute), hotplug.NoImage, "", nil,
			"volume "+volume, "no file found in folder /disk"),
		Entry("a containerDisk path naming a missing file", SpecTimeout(time.Minute), hotplug.RawFile, "/disk/missing.img", nil,
			"volume "+volume, "/disk/missing.img"),
		Entry("the socket removed: the program exits", SpecTimeout(time.Minute), hotplug.RawFile, "",
			func(ctx context.Context, c *hotplug.Container) {
				Expect(os.Remove(c.Socket)).To(Succeed())
				Expect(c.Wait(ctx)).To(Succeed())
			},
			"volume "+volume, "disk.sock", "no such file or directory"),
		Entry("the program gone, its socket left behind", SpecTimeout(time.Minute), hotplug.RawFile, "",
			func(ctx context.Context, c *hotplug.Container) { Expect(c.Kill(ctx)).To(Succeed()) },
			"volume "+volume, "disk.sock", "connection refused"),
	)

	It("either mounts or refuses cleanly when the socket vanishes during the mount", func(ctx SpecContext) {
		const tries = 10
		l := layer(ctx, hotplug.RawFile)
		DeferCleanup(teardown)

		// The socket goes at points spread over a whole mount step.
		pod := newPod()
		c := start(ctx, pod, l)
		began := time.Now()
		_, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: pod}))
		Expect(err).ToNot(HaveOccurred())
		step := time.Since(began)
		_, err = node.Unmount(ctx, hotplug.VMI(hotplugPhaseAttached), false)
		Expect(err).ToNot(HaveOccurred())
		Expect(c.Stop(ctx)).To(Succeed())

		outcomes := map[bool]int{}
		for i := 0; i < tries; i++ {
			pod := newPod()
			c := start(ctx, pod, l)
			vmi := hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: pod})
			removed := make(chan error, 1)
			go func() {
				time.Sleep(step * time.Duration(i) / tries)
				removed <- os.Remove(c.Socket)
			}()
			_, err := node.Mount(ctx, vmi)
			Expect(<-removed).To(Succeed())
			outcomes[err == nil]++
			if err != nil {
				Expect(err.Error()).To(ContainSubstring("volume " + volume))
				Expect(mountsUnder(testenv.MountPoints, node.KubeletPods)).To(BeEmpty())
			}
			_, err = node.Unmount(ctx, hotplug.VMI(hotplugPhaseAttached), false)
			Expect(err).ToNot(HaveOccurred())
			Expect(c.Stop(ctx)).To(Succeed())
			expectNothingLeft(ctx)
		}
		GinkgoWriter.Printf("socket removed within %v: mounted %d times, refused %d times\n", step, outcomes[true], outcomes[false])
	}, SpecTimeout(5*time.Minute))

	It("refuses two volumes with one name, naming both", func(ctx SpecContext) {
		causes, err := node.Validate(ctx,
			hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: newPod()}, hotplug.Volume{Name: volume, AttachPodUID: newPod()}),
			hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: newPod()}))
		Expect(err).ToNot(HaveOccurred())
		Expect(causes).To(HaveLen(2))
		Expect(causes[0]).To(ContainElement(HaveField("Message", "spec.volumes[1] and spec.volumes[0] must not have the same Name.")))
		Expect(causes[1]).To(BeEmpty(), "one hotplugged containerDisk is valid")
	}, SpecTimeout(5*time.Minute))

	// The kernel ignores MS_RDONLY when it creates a bind mount, and a
	// remount read-only would not reach the copy propagated into QEMU's
	// mount namespace: the mount must be read-only in both.
	It("bind mounts a file image read-only, also where QEMU sees it", func(ctx SpecContext) {
		l := layer(ctx, hotplug.RawFile)
		pod := newPod()
		start(ctx, pod, l)
		DeferCleanup(teardown)
		_, err := node.Mount(ctx, hotplug.VMI(hotplugPhaseAttached, hotplug.Volume{Name: volume, AttachPodUID: pod}))
		Expect(err).ToNot(HaveOccurred())
		for _, mounts := range []func() ([]testenv.Mount, error){testenv.MountPoints, lv.Mounts} {
			m := mountsUnder(mounts, node.KubeletPods)
			Expect(m).To(HaveLen(1))
			Expect(strings.Split(m[0].Options, ",")).To(ContainElement("ro"))
		}
		_, err = os.OpenFile(filepath.Join(node.LauncherHotplugDir(), volume+".img"), os.O_RDWR, 0)
		Expect(err).To(MatchError(unix.EROFS))
	}, SpecTimeout(time.Minute))
})

// fdCount is the number of open file descriptors of a process.
func fdCount(pid int) int {
	GinkgoHelper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	Expect(err).ToNot(HaveOccurred())
	return len(entries)
}

// zombieChildren lists the test process's children that exited unreaped.
func zombieChildren() []int {
	GinkgoHelper()
	entries, err := os.ReadDir("/proc")
	Expect(err).ToNot(HaveOccurred())
	var zombies []int
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold blanks.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[0] == "Z" && fields[1] == fmt.Sprint(os.Getpid()) {
			pid, _ := strconv.Atoi(e.Name())
			zombies = append(zombies, pid)
		}
	}
	return zombies
}

// The volume status phases virt-handler mounts in and the launcher attaches
// in.
const (
	hotplugPhaseAttached = "AttachedToNode"
	hotplugPhaseMounted  = "MountedToPod"
)

// checksum is the CRC32 virt-handler records for an image, of a file or a
// device's content.
func checksum(path string) uint32 {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	h := crc32.NewIEEE()
	_, err = io.Copy(h, f)
	Expect(err).ToNot(HaveOccurred())
	return h.Sum32()
}

// mountsUnder lists the mounts at or beneath dir.
func mountsUnder(list func() ([]testenv.Mount, error), dir string) []testenv.Mount {
	GinkgoHelper()
	mounts, err := list()
	Expect(err).ToNot(HaveOccurred())
	var under []testenv.Mount
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			under = append(under, m)
		}
	}
	return under
}

// tempDir is a directory removed after the spec, unless something is still
// mounted beneath it.
func tempDir() string {
	GinkgoHelper()
	dir, err := os.MkdirTemp("", "hotplug-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(func() { Expect(removeUnmounted(dir)).To(Succeed()) })
	return dir
}

// removeUnmounted removes dir, refusing while anything is mounted beneath
// it: removing would reach into what is mounted.
func removeUnmounted(dir string) error {
	mounts, err := testenv.MountPoints()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, dir+"/") {
			return fmt.Errorf("not removing %s: %s is still mounted", dir, m.MountPoint)
		}
	}
	return os.RemoveAll(dir)
}
