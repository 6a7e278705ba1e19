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

package overlay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

const (
	mib = 1 << 20
	// backingSize is the golden image's size; a Block mode target holds the
	// overlay written in full plus the 1 MiB record area.
	backingSize = 64 * mib
	targetSize  = 80 * mib
	volume      = "rootdisk"
)

var (
	// firstBoot and secondBoot write different regions with different
	// patterns: both must be in a persistent overlay after the second.
	firstBoot  = testenv.GuestParams{StartLBA: 1, Sectors: 2048, Seed: 7}
	secondBoot = testenv.GuestParams{StartLBA: 8192, Sectors: 2048, Seed: 11}
)

// Paths of the virt-launcher compute container, as the converter and the
// overlay creator name them (pkg/storage/overlay of the patched tree).
var (
	backingDevice  = testenv.OverlayBackingDevice(volume)
	targetDevice   = testenv.OverlayTargetDevice(volume)
	backingImage   = testenv.OverlayBackingImage(volume)
	targetImage    = testenv.OverlayTargetDir(volume) + "/disk.qcow2"
	ephemeralImage = testenv.OverlayEphemeralImage(volume)
)

const backingRecorded = "sampled-sha256"

type backingKind int

const (
	rawFile backingKind = iota
	qcow2File
	rawDevice
)

type targetKind int

const (
	noTarget targetKind = iota
	fileTarget
	deviceTarget
)

// pod stands for a virt-launcher pod on the test host: the compute
// container's directories under a temporary root, and loop devices for
// Block mode claims. The tool finds every container path through its maps.
type pod struct {
	testenv.Launcher

	backing       string // where the backing is on the host
	backingFormat string
	target        string // the overlay on the host
	targetIsBlock bool
}

func newPod(ctx context.Context, backing backingKind, target targetKind) *pod {
	GinkgoHelper()
	root := GinkgoT().TempDir()
	p := &pod{
		Launcher: testenv.Launcher{
			Tool: vmi2domain,
			VMI:  filepath.Join(root, "vmi.yaml"),
			Maps: map[string]string{
				testenv.LauncherPrivateDir:   filepath.Join(root, "private"),
				testenv.LauncherEphemeralDir: filepath.Join(root, "ephemeral"),
			},
			BackingClaims: map[string]string{volume: "golden-uid"},
		},
		backingFormat: "raw",
	}

	golden := filepath.Join(root, "golden.raw")
	Expect(testenv.CreateBootDisk(ctx, golden, backingSize, firstBoot)).To(Succeed())
	switch backing {
	case rawFile:
		p.backing = p.Host(backingImage)
		Expect(os.MkdirAll(filepath.Dir(p.backing), 0o755)).To(Succeed())
		Expect(os.Rename(golden, p.backing)).To(Succeed())
	case qcow2File:
		p.backing = p.Host(backingImage)
		p.backingFormat = "qcow2"
		Expect(os.MkdirAll(filepath.Dir(p.backing), 0o755)).To(Succeed())
		_, err := testenv.QemuImg(ctx, "convert", "-f", "raw", "-O", "qcow2", golden, p.backing)
		Expect(err).ToNot(HaveOccurred())
	case rawDevice:
		dev, err := testenv.AttachLoop(ctx, golden)
		framework.Require(err, "a loop device")
		DeferCleanup(func(ctx SpecContext) { Expect(testenv.DetachLoop(ctx, dev)).To(Succeed()) })
		p.Maps[backingDevice] = dev
		p.backing = dev
	}

	overlay := []string{"backingPVC: {claimName: golden}", "backingFormat: " + p.backingFormat}
	switch target {
	case noTarget:
		p.target = p.Host(ephemeralImage)
	case fileTarget:
		overlay = append(overlay, "persistent: true", "targetPVC: {claimName: delta}")
		p.target = p.Host(targetImage)
		Expect(os.MkdirAll(filepath.Dir(p.target), 0o755)).To(Succeed())
	case deviceTarget:
		overlay = append(overlay, "persistent: true", "targetPVC: {claimName: delta}")
		dev, err := testenv.CreateLoopFile(ctx, filepath.Join(root, "target.img"), targetSize)
		framework.Require(err, "a loop device")
		DeferCleanup(func(ctx SpecContext) { Expect(testenv.DetachLoop(ctx, dev)).To(Succeed()) })
		p.Maps[targetDevice] = dev
		p.target = dev
		p.targetIsBlock = true
	}

	Expect(os.WriteFile(p.VMI, []byte(testenv.OverlayVMI("overlay-guest", "tests", volume, overlay...)), 0o644)).To(Succeed())
	return p
}

// overlayDisk runs the pre-start step and returns the domain's overlay disk,
// as the patched converter wrote it.
func (p *pod) overlayDisk(ctx context.Context) libvirtxml.DomainDisk {
	GinkgoHelper()
	dom, err := p.Prepare(ctx)
	Expect(err).ToNot(HaveOccurred())
	Expect(dom.Devices.Disks).To(HaveLen(1))
	return dom.Devices.Disks[0]
}

var _ = Describe("overlay volumes booted from the patched converter's domain", Ordered, func() {
	var lv *testenv.Libvirtd

	BeforeAll(func(ctx SpecContext) {
		lv = framework.StartSuiteLibvirtd(ctx)
	}, NodeTimeout(2*time.Minute))

	domains := 0

	// boot starts a domain with the overlay disk, waits for the guest to
	// finish writing, and stops the domain for good.
	boot := func(ctx context.Context, disk libvirtxml.DomainDisk) {
		GinkgoHelper()
		domains++
		name := fmt.Sprintf("overlay-guest-%d", domains)
		DeferCleanup(func(ctx SpecContext) { Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed()) })
		Expect(lv.DefineAndStart(ctx, lv.NewDomain(name, disk))).To(Succeed())
		status, err := lv.WaitForGuest(ctx, name)
		Expect(err).ToNot(HaveOccurred())
		Expect(status.Done).To(BeTrue(), "guest status %+v", status)
		Expect(status.Failed).To(BeFalse(), "guest status %+v", status)
		Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed())
	}

	backingSum := func(p *pod) string {
		GinkgoHelper()
		sum, err := testenv.SHA256(p.backing)
		Expect(err).ToNot(HaveOccurred())
		return sum
	}

	DescribeTable("an ephemeral overlay takes the guest's writes and is gone after teardown",
		func(ctx SpecContext, backing backingKind, sourceType, backingType, backingFormat string) {
			p := newPod(ctx, backing, noTarget)
			before := backingSum(p)

			disk := p.overlayDisk(ctx)
			Expect(disk.Source.File).ToNot(BeNil())
			Expect(disk.Source.File.File).To(Equal(p.target))
			Expect(disk.Driver.Type).To(Equal(sourceType))
			Expect(disk.BackingStore).ToNot(BeNil())
			Expect(disk.BackingStore.Format.Type).To(Equal(backingFormat))
			if backingType == "block" {
				Expect(disk.BackingStore.Source.Block.Dev).To(Equal(p.backing))
			} else {
				Expect(disk.BackingStore.Source.File.File).To(Equal(p.backing))
			}

			boot(ctx, disk)

			Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(p.target, qcow2.FormatQcow2), "", firstBoot)).To(Succeed())
			Expect(backingSum(p)).To(Equal(before))

			Expect(p.Cleanup(ctx)).To(Succeed())
			Expect(p.target).ToNot(BeAnExistingFile())
			Expect(filepath.Dir(p.target)).ToNot(BeAnExistingFile())
			Expect(backingSum(p)).To(Equal(before))
		},
		Entry("over a raw backing file", rawFile, "qcow2", "file", "raw", SpecTimeout(3*time.Minute)),
		Entry("over a qcow2 backing file", qcow2File, "qcow2", "file", "qcow2", SpecTimeout(3*time.Minute)),
		Entry("over a Block mode backing (loop device)", rawDevice, "qcow2", "block", "raw", SpecTimeout(3*time.Minute)),
	)

	DescribeTable("a persistent overlay keeps the guest's data across a full stop and start",
		func(ctx SpecContext, target targetKind) {
			p := newPod(ctx, rawFile, target)
			before := backingSum(p)

			disk := p.overlayDisk(ctx)
			if target == deviceTarget {
				Expect(disk.Source.Block).ToNot(BeNil())
				Expect(disk.Source.Block.Dev).To(Equal(p.target))
			} else {
				Expect(disk.Source.File).ToNot(BeNil())
				Expect(disk.Source.File.File).To(Equal(p.target))
			}
			boot(ctx, disk)
			Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(p.target, qcow2.FormatQcow2), "", firstBoot)).To(Succeed())

			// The teardown step leaves a persistent overlay alone.
			Expect(p.Cleanup(ctx)).To(Succeed())
			if !p.targetIsBlock {
				Expect(p.target).To(BeARegularFile())
			}

			// The next boot writes elsewhere: its guest goes into the overlay.
			Expect(testenv.WriteBootSector(ctx, testenv.OverlayOver(p.target, p.backing, p.backingFormat), "", secondBoot)).To(Succeed())
			boot(ctx, p.overlayDisk(ctx))

			Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(p.target, qcow2.FormatQcow2), "", firstBoot)).To(Succeed())
			Expect(testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(p.target, qcow2.FormatQcow2), "", secondBoot)).To(Succeed())
			Expect(backingSum(p)).To(Equal(before))
		},
		Entry("in a file target", fileTarget, SpecTimeout(4*time.Minute)),
		Entry("on a Block mode target (loop device)", deviceTarget, SpecTimeout(4*time.Minute)),
	)

	// rewrite gives the backing another image of the same size: a
	// rewritten boot sector.
	rewrite := func(ctx context.Context, p *pod) {
		Expect(testenv.WriteBootSector(ctx, p.backing, "raw", secondBoot)).To(Succeed())
	}
	// recreate puts the same bytes on another claim: a golden image is
	// immutable, a new version is a new claim.
	recreate := func(_ context.Context, p *pod) {
		p.BackingClaims = map[string]string{volume: "golden-uid-2"}
	}
	rewritten := fmt.Sprintf("size %d, %s", backingSize, backingRecorded)
	recreated := []string{`claim UID golden-uid bound to "pv-golden-uid" then`, `claim UID golden-uid-2 bound to "pv-golden-uid-2" now`}

	DescribeTable("a persistent overlay over a changed backing is refused, saying why",
		func(ctx SpecContext, target targetKind, overlayPath string, change func(context.Context, *pod), said ...string) {
			p := newPod(ctx, rawFile, target)
			p.overlayDisk(ctx)
			overlayBefore, err := testenv.SHA256(p.target)
			Expect(err).ToNot(HaveOccurred())

			change(ctx, p)
			_, stderr, err := p.Run(ctx, "-prepare")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring("overlay volume " + volume + ": refusing to start: the backing image of overlay " + overlayPath + " changed since the overlay was created"))
			for _, words := range said {
				Expect(stderr).To(ContainSubstring(words))
			}

			overlayAfter, err := testenv.SHA256(p.target)
			Expect(err).ToNot(HaveOccurred())
			Expect(overlayAfter).To(Equal(overlayBefore), "a refused overlay is left as it was")
		},
		Entry("rewritten, in a file target", fileTarget, targetImage, rewrite, rewritten, SpecTimeout(2*time.Minute)),
		Entry("rewritten, on a Block mode target (loop device)", deviceTarget, targetDevice, rewrite, rewritten, SpecTimeout(2*time.Minute)),
		Entry("on a claim created again, in a file target", fileTarget, targetImage, recreate, recreated[0], recreated[1], SpecTimeout(2*time.Minute)),
		Entry("on a claim created again, on a Block mode target (loop device)", deviceTarget, targetDevice, recreate, recreated[0], recreated[1], SpecTimeout(2*time.Minute)),
	)

	It("a qcow2 backing that keeps its data in an external data file is refused before qemu-img opens it", func(ctx SpecContext) {
		p := newPod(ctx, qcow2File, noTarget)
		// The data file's name is the image author's: qemu-img would open
		// whatever it names in the pod.
		Expect(os.Remove(p.backing)).To(Succeed())
		_, err := testenv.QemuImg(ctx, "create", "-f", "qcow2", "-o", "data_file="+p.backing+".data", p.backing, strconv.Itoa(backingSize))
		Expect(err).ToNot(HaveOccurred())

		_, stderr, err := p.Run(ctx, "-prepare")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("refusing to start: " + p.backing + " is a qcow2 image that keeps its data in an external data file it names"))
		Expect(p.target).ToNot(BeAnExistingFile())
	}, SpecTimeout(2*time.Minute))
})
