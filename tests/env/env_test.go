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

package env_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

const (
	mib      = int64(1) << 20
	diskSize = 16 * mib
	// 1 MiB of guest writes: a few dozen INT 13h calls.
	guestSectors = 2048
)

// guestParams writes guestSectors sectors from LBA 8 with a seed that
// differs per spec and per run (reproducible with --seed).
func guestParams(salt uint32) testenv.GuestParams {
	return testenv.GuestParams{
		StartLBA:      8,
		Sectors:       guestSectors,
		ProgressEvery: 4,
		Seed:          uint32(GinkgoRandomSeed()) ^ salt,
	}
}

// runGuest starts a domain on d, waits for the test guest to finish and
// returns what it reported; the domain stays defined and running (halted)
// until the spec ends.
func runGuest(ctx context.Context, d *testenv.Libvirtd, dom *libvirtxml.Domain) testenv.GuestStatus {
	GinkgoHelper()
	Expect(d.DefineAndStart(ctx, dom)).To(Succeed())
	DeferCleanup(d.DestroyAndUndefine, dom.Name, NodeTimeout(time.Minute))
	status, err := d.WaitForGuest(ctx, dom.Name)
	Expect(err).NotTo(HaveOccurred())
	Expect(status.Failed).To(BeFalse(), "guest reported INT 13h error %#x", status.Err)
	return status
}

var _ = Describe("the test guest", func() {
	DescribeTable("boots from a raw disk and writes what the host reads back",
		func(ctx SpecContext, virtType func() string) {
			p := guestParams(0x1)
			disk := filepath.Join(GinkgoT().TempDir(), "disk.raw")
			Expect(testenv.CreateBootDisk(ctx, disk, diskSize, p)).To(Succeed())

			name := "raw-" + virtType()
			dom := daemon.NewDomain(name, testenv.FileDisk(disk, "raw", "vda"))
			dom.Type = virtType()
			status := runGuest(ctx, daemon, dom)
			Expect(status.Done).To(BeTrue())
			Expect(status.Written).To(BeEquivalentTo(p.Sectors))

			serial, err := daemon.ReadSerial(name)
			Expect(err).NotTo(HaveOccurred())
			Expect(serial).To(HavePrefix(fmt.Sprintf("START %08x %08x %08x\r\n", p.StartLBA, p.Sectors, p.Seed)))
			Expect(strings.Count(serial, "PROGRESS ")).To(BeNumerically(">=", 2), "periodic progress lines")
			Expect(serial).To(HaveSuffix(fmt.Sprintf("DONE %08x\r\n", p.Sectors)))

			Expect(testenv.VerifyGuestWrites(ctx, disk, "raw", p)).To(Succeed())
			otherSeed := p
			otherSeed.Seed++
			Expect(testenv.VerifyGuestWrites(ctx, disk, "raw", otherSeed)).NotTo(Succeed(), "the pattern depends on the seed")
			bootSector, err := p.BootSector(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(testenv.ReadSectors(ctx, disk, "raw", 0, 1)).To(Equal(bootSector), "sector 0 stays intact")
			Expect(testenv.ReadSectors(ctx, disk, "raw", 1, p.StartLBA-1)).To(Equal(make([]byte, (p.StartLBA-1)*testenv.SectorSize)), "no writes before the start")
			Expect(testenv.ReadSectors(ctx, disk, "raw", p.StartLBA+uint64(p.Sectors), 1)).To(Equal(make([]byte, testenv.SectorSize)), "no writes after the end")
		},
		Entry("with the daemon's virt type (KVM when it works)", func() string { return daemon.VirtType() }, SpecTimeout(2*time.Minute)),
		Entry("under TCG", func() string { return "qemu" }, SpecTimeout(2*time.Minute)),
	)

	It("reports the INT 13h status when a write fails", func(ctx SpecContext) {
		// The last call runs past the end of a 1 MiB disk.
		p := testenv.GuestParams{StartLBA: 1, Sectors: 2048, Seed: 5}
		disk := filepath.Join(GinkgoT().TempDir(), "small.raw")
		Expect(testenv.CreateBootDisk(ctx, disk, mib, p)).To(Succeed())
		const name = "write-error"
		Expect(daemon.DefineAndStart(ctx, daemon.NewDomain(name, testenv.FileDisk(disk, "raw", "vda")))).To(Succeed())
		DeferCleanup(daemon.DestroyAndUndefine, name, NodeTimeout(time.Minute))
		status, err := daemon.WaitForGuest(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Failed).To(BeTrue())
		Expect(status.Err).NotTo(BeZero())
		Expect(status.Written).To(BeNumerically("<", p.Sectors))

		By("stopping the domain, which stays defined")
		_, err = daemon.Virsh(ctx, "destroy", name)
		Expect(err).NotTo(HaveOccurred())
		Expect(daemon.WaitForState(ctx, name, testenv.StateShutOff)).To(Succeed())
	}, SpecTimeout(time.Minute))

	It("paces its writes with DelayMicros", func(ctx SpecContext) {
		p := testenv.GuestParams{StartLBA: 1, Sectors: 3 * 16, SectorsPerCall: 16, ProgressEvery: 1, DelayMicros: 1_000_000, Seed: 6}
		disk := filepath.Join(GinkgoT().TempDir(), "paced.raw")
		Expect(testenv.CreateBootDisk(ctx, disk, diskSize, p)).To(Succeed())
		const name = "paced"
		Expect(daemon.DefineAndStart(ctx, daemon.NewDomain(name, testenv.FileDisk(disk, "raw", "vda")))).To(Succeed())
		DeferCleanup(daemon.DestroyAndUndefine, name, NodeTimeout(time.Minute))
		status := func() (testenv.GuestStatus, error) {
			serial, err := daemon.ReadSerial(name)
			return testenv.ParseGuestStatus(serial), err
		}
		By("seeing the first call's progress while the guest waits")
		Eventually(status).WithContext(ctx).Should(And(
			HaveField("Written", BeEquivalentTo(16)),
			HaveField("Done", BeFalse()),
		))

		By("pausing and resuming the domain")
		_, err := daemon.Virsh(ctx, "suspend", name)
		Expect(err).NotTo(HaveOccurred())
		Expect(daemon.WaitForState(ctx, name, testenv.StatePaused)).To(Succeed())
		state, reason, err := daemon.DomainState(ctx, name)
		Expect(err).NotTo(HaveOccurred())
		Expect(state).To(Equal(testenv.StatePaused))
		Expect(reason).To(Equal("user"))
		_, err = daemon.Virsh(ctx, "resume", name)
		Expect(err).NotTo(HaveOccurred())
		Expect(daemon.WaitForState(ctx, name, testenv.StateRunning)).To(Succeed())

		Eventually(status).WithContext(ctx).Should(HaveField("Done", BeTrue()))
		Expect(testenv.VerifyGuestWrites(ctx, disk, "raw", p)).To(Succeed())
	}, SpecTimeout(time.Minute))

	It("writes through a qcow2 overlay into the overlay, leaving the raw backing unchanged", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		backing := filepath.Join(dir, "golden.raw")
		overlay := filepath.Join(dir, "overlay.qcow2")
		// The golden image's guest writes nothing; the overlay gets its own.
		Expect(testenv.CreateBootDisk(ctx, backing, diskSize, testenv.GuestParams{StartLBA: 1})).To(Succeed())
		backingHash, err := testenv.SHA256(backing)
		Expect(err).NotTo(HaveOccurred())
		Expect(qcow2.Tool{}.CreateOverlay(ctx, overlay, backing, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
		p := guestParams(0x2)
		Expect(testenv.WriteBootSector(ctx, overlay, "qcow2", p)).To(Succeed())

		info, err := qcow2.Tool{}.Info(ctx, overlay, qcow2.InfoOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Format).To(Equal("qcow2"))
		Expect(info.VirtualSize).To(Equal(diskSize))
		Expect(info.FullBackingFilename).To(Equal(backing))
		Expect(info.BackingFormat).To(Equal("raw"))

		const name = "overlay-file"
		dom := daemon.NewDomain(name, testenv.FileDisk(overlay, "qcow2", "vda"))
		status := runGuest(ctx, daemon, dom)
		Expect(status.Written).To(BeEquivalentTo(p.Sectors))

		By("seeing the chain in the running QEMU over QMP and HMP")
		blocks, err := daemon.QMP(ctx, name, "query-block", nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(blocks)).To(And(ContainSubstring(overlay), ContainSubstring(backing)))
		infoBlock, err := daemon.HMP(ctx, name, "info block")
		Expect(err).NotTo(HaveOccurred())
		Expect(infoBlock).To(ContainSubstring(overlay))
		_, err = qcow2.Tool{}.Info(ctx, overlay, qcow2.InfoOptions{Shared: true})
		Expect(err).NotTo(HaveOccurred(), "qemu-img -U reads an image in use")

		Expect(daemon.DestroyAndUndefine(ctx, name)).To(Succeed())
		Expect(testenv.VerifyGuestWrites(ctx, overlay, "qcow2", p)).To(Succeed())
		Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(overlay, qcow2.FormatQcow2), "", p)).To(Succeed(), "the writes are in the overlay itself")
		Expect(testenv.SHA256(backing)).To(Equal(backingHash))
		check, err := qcow2.Tool{}.Check(ctx, overlay, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
		Expect(err).NotTo(HaveOccurred())
		Expect(check.Clean()).To(BeTrue(), "%+v", check)
	}, SpecTimeout(2*time.Minute))

	It("writes through a qcow2 overlay on a loop device with an explicit backingStore", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		backing := filepath.Join(dir, "golden.raw")
		p := guestParams(0x3)
		Expect(testenv.CreateBootDisk(ctx, backing, diskSize, p)).To(Succeed())
		backingHash, err := testenv.SHA256(backing)
		Expect(err).NotTo(HaveOccurred())

		loopFile := filepath.Join(dir, "overlay.loop")
		dev, err := testenv.CreateLoopFile(ctx, loopFile, 4*mib)
		framework.Require(err, "loop device")
		DeferCleanup(testenv.DetachLoop, dev, NodeTimeout(time.Minute))
		Expect(qcow2.Tool{}.CreateOverlay(ctx, dev, backing, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())

		const name = "overlay-block"
		disk := testenv.WithBackingFile(testenv.BlockDisk(dev, "qcow2", "vda"), backing, "raw")
		status := runGuest(ctx, daemon, daemon.NewDomain(name, disk))
		Expect(status.Written).To(BeEquivalentTo(p.Sectors))

		By("growing the loop device online: QEMU sees the new size")
		Expect(testenv.GrowLoop(ctx, dev, loopFile, 8*mib)).To(Succeed())
		Expect(testenv.DeviceSize(dev)).To(Equal(8 * mib))
		Eventually(func(ctx context.Context) (string, error) {
			return daemon.Virsh(ctx, "domblkinfo", name, "vda")
		}).WithContext(ctx).Should(MatchRegexp(`(?m)^Physical:\s+%d$`, 8*mib))

		Expect(daemon.DestroyAndUndefine(ctx, name)).To(Succeed())
		Expect(testenv.VerifyGuestWrites(ctx, dev, "qcow2", p)).To(Succeed())
		Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(dev, qcow2.FormatQcow2), "", p)).To(Succeed())
		Expect(testenv.SHA256(backing)).To(Equal(backingHash))
		for _, opts := range []qcow2.InfoOptions{{Format: qcow2.FormatQcow2}, {Format: qcow2.FormatQcow2, NoBacking: true}} {
			check, err := qcow2.Tool{}.Check(ctx, dev, opts)
			Expect(err).NotTo(HaveOccurred())
			Expect(check.Clean()).To(BeTrue(), "%+v", check)
		}
	}, SpecTimeout(2*time.Minute))
})

var _ = Describe("a private libvirtd", func() {
	It("keeps its mounts to itself, sees host mounts under SharedDir and leaves nothing behind", func(ctx SpecContext) {
		systemRun, systemRunErr := os.Lstat("/run/libvirt")

		d, err := testenv.StartLibvirtd(ctx)
		framework.Require(err, "second private libvirtd")
		DeferCleanup(d.Stop, NodeTimeout(time.Minute))

		By("covering the system paths only inside its namespace")
		Expect(hostMountsAt(coveredPaths...)).To(BeEmpty(), "the host does not see the daemon's bind mounts")
		Expect(hostMountsIn(d.Dir())).To(ConsistOf(d.SharedDir()))
		nsMounts := map[string]bool{}
		mounts, err := d.Mounts()
		Expect(err).NotTo(HaveOccurred())
		for _, m := range mounts {
			nsMounts[m.MountPoint] = true
		}
		Expect(nsMounts).To(HaveKey("/run"))
		Expect(nsMounts).To(HaveKey("/etc/libvirt"))
		conf, err := d.NamespaceCommand(ctx, "cat", "/etc/libvirt/qemu.conf").Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(conf)).To(ContainSubstring(`security_driver = "none"`))
		Expect(filepath.Join(d.Dir(), "run", "libvirt", "libvirt-sock")).To(BeAnExistingFile())

		By("letting QEMU open an image bind-mounted under SharedDir after the start")
		p := guestParams(0x4)
		image := filepath.Join(GinkgoT().TempDir(), "disk.raw")
		Expect(testenv.CreateBootDisk(ctx, image, diskSize, p)).To(Succeed())
		target := filepath.Join(d.SharedDir(), "disk.raw")
		unmount := bindMount(image, target)
		const name = "shared-mount"
		runGuest(ctx, d, d.NewDomain(name, testenv.FileDisk(target, "raw", "vda")))
		Expect(d.DestroyAndUndefine(ctx, name)).To(Succeed())
		Expect(unmount()).To(Succeed())
		Expect(testenv.VerifyGuestWrites(ctx, image, "raw", p)).To(Succeed())

		By("stopping with a domain still running")
		runGuest(ctx, d, d.NewDomain(name+"-2", testenv.FileDisk(image, "raw", "vda")))
		Expect(commands(d)).To(ContainElements("libvirtd", "qemu-system-x86"))
		Expect(d.Stop(ctx)).To(Succeed())
		Expect(commands(d)).To(BeEmpty(), "nothing runs in the daemon's namespace")
		Expect(fmt.Sprintf("/proc/%d", d.Pid())).NotTo(BeADirectory())
		Expect(d.Dir()).NotTo(BeAnExistingFile())
		Expect(hostMountsIn(d.Dir())).To(BeEmpty())
		after, afterErr := os.Lstat("/run/libvirt")
		Expect(afterErr == nil).To(Equal(systemRunErr == nil), "/run/libvirt existence")
		if systemRunErr == nil {
			Expect(after.ModTime()).To(Equal(systemRun.ModTime()))
		}
		Expect(daemon.Virsh(ctx, "version")).To(ContainSubstring("libvirt"), "the suite's daemon still answers")
	}, SpecTimeout(3*time.Minute))
})

// The paths a private libvirtd covers with its own directories.
var coveredPaths = []string{"/etc/libvirt", "/run", "/var/lib/libvirt", "/var/log/libvirt", "/var/cache/libvirt"}

// hostMountsAt lists the test process's mount points that are one of paths.
func hostMountsAt(paths ...string) []string {
	GinkgoHelper()
	mounts, err := testenv.MountPoints()
	Expect(err).NotTo(HaveOccurred())
	var found []string
	for _, m := range mounts {
		if slices.Contains(paths, m.MountPoint) {
			found = append(found, m.MountPoint)
		}
	}
	return found
}

// commands lists the command names of the processes in d's namespace.
func commands(d *testenv.Libvirtd) []string {
	GinkgoHelper()
	pids, err := d.Processes()
	Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, pid := range pids {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil {
			names = append(names, strings.TrimSpace(string(comm)))
		}
	}
	return names
}

// hostMountsIn lists the test process's mount points at or beneath dirs.
func hostMountsIn(dirs ...string) []string {
	GinkgoHelper()
	mounts, err := testenv.MountPoints()
	Expect(err).NotTo(HaveOccurred())
	var found []string
	for _, m := range mounts {
		for _, dir := range dirs {
			if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
				found = append(found, m.MountPoint)
			}
		}
	}
	return found
}

// bindMount bind-mounts the file src onto target, a new file, until the
// returned unmount runs or the spec ends.
func bindMount(src, target string) (unmount func() error) {
	GinkgoHelper()
	Expect(os.WriteFile(target, nil, 0o644)).To(Succeed())
	Expect(unix.Mount(src, target, "", unix.MS_BIND, "")).To(Succeed())
	var once sync.Once
	var err error
	unmount = func() error {
		once.Do(func() { err = unix.Unmount(target, 0) })
		return err
	}
	DeferCleanup(unmount)
	return unmount
}
