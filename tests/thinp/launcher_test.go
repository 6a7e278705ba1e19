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

package thinp_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// thinReport is a line of the thinmonitor tool (testdata/thinmonitor): what
// the patched launcher's thinprovisioning.Monitor reported after a check.
type thinReport struct {
	Disks []struct {
		Volume        string
		Allocation    int64 `json:"allocation"`
		Physical      int64 `json:"physical"`
		RequiredSize  int64 `json:"requiredSize"`
		MaximumSize   int64 `json:"maximumSize"`
		PausedNoSpace bool  `json:"pausedNoSpace"`
	} `json:"disks"`
	Events []struct{ Type, Reason, Message string } `json:"events"`
	Error  string                                   `json:"error"`
}

// headerRecord returns the data of the overlay record extension ("kvor",
// patch 0011) in the qcow2 header at the start of dev, without its crc,
// after checking the crc.
func headerRecord(dev string) ([]byte, error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, 64<<10)
	if _, err := f.ReadAt(head, 0); err != nil {
		return nil, err
	}
	if string(head[:4]) != "QFI\xfb" || binary.BigEndian.Uint32(head[4:]) < 3 {
		return nil, fmt.Errorf("%s does not start with a qcow2 v3 header", dev)
	}
	for at := int(binary.BigEndian.Uint32(head[100:])); at+8 <= len(head); {
		kind, length := binary.BigEndian.Uint32(head[at:]), int(binary.BigEndian.Uint32(head[at+4:]))
		if kind == 0 || at+8+length > len(head) {
			break
		}
		data := head[at+8 : at+8+length]
		if kind == 0x6b766f72 {
			if length < 4 || crc32.ChecksumIEEE(data[4:]) != binary.BigEndian.Uint32(data) {
				return nil, fmt.Errorf("the overlay record in %s has a bad crc", dev)
			}
			return append([]byte(nil), data[4:]...), nil
		}
		at += 8 + (length+7)/8*8
	}
	return nil, fmt.Errorf("no overlay record in the qcow2 header of %s", dev)
}

var _ = Describe("The patched virt-launcher's thin provisioned overlay on a loop device", Ordered, func() {
	const (
		volume      = "rootdisk"
		virtualSize = 64 * mib
		deviceSize  = 4 * mib
		chunk       = 4 * mib
	)
	var (
		tools      string
		launcher   testenv.Launcher
		thinVMI    string
		dev        string
		loopFile   string
		backing    string
		backingSum string
	)
	// The guest writes 24 MiB, six times the device it starts on.
	writer := testenv.GuestParams{StartLBA: 1, Sectors: uint32(24 * mib / testenv.SectorSize), ProgressEvery: 64, Seed: 0x1a7c}

	BeforeAll(func(ctx SpecContext) {
		_, err := os.Stat(filepath.Join(testenv.KubeVirtTree(), "pkg", "virt-launcher", "virtwrap", "thinprovisioning", "monitor.go"))
		framework.Require(err, "the patched KubeVirt tree with thin provisioning (hack/kubevirt.sh apply)")
		tools = GinkgoT().TempDir()
		Expect(testenv.BuildInKubeVirtTree(ctx, map[string]string{
			"cmd/vmi2domain":  filepath.Join(testenv.RepoRoot(), "internal", "testenv", "testdata", "vmi2domain", "main.go"),
			"cmd/thinmonitor": filepath.Join(testenv.RepoRoot(), "tests", "thinp", "testdata", "thinmonitor", "main.go"),
		}, tools)).To(Succeed())

		root := GinkgoT().TempDir()
		launcher = testenv.Launcher{
			Tool:          testenv.VMI2Domain(filepath.Join(tools, "vmi2domain")),
			Maps:          map[string]string{testenv.LauncherPrivateDir: filepath.Join(root, "private")},
			BackingClaims: map[string]string{volume: "golden-uid"},
		}
		backing = launcher.Host(testenv.OverlayBackingImage(volume))
		Expect(os.MkdirAll(filepath.Dir(backing), 0o755)).To(Succeed())
		Expect(testenv.CreateBootDisk(ctx, backing, virtualSize, writer)).To(Succeed())
		backingSum, err = testenv.SHA256(backing)
		Expect(err).ToNot(HaveOccurred())

		loopFile = filepath.Join(root, "target.img")
		dev, err = testenv.CreateLoopFile(ctx, loopFile, deviceSize)
		framework.Require(err, "a loop device")
		DeferCleanup(func(ctx SpecContext) { Expect(testenv.DetachLoop(ctx, dev)).To(Succeed()) })
		launcher.Maps[testenv.OverlayTargetDevice(volume)] = dev

		overlay := []string{"backingPVC: {claimName: golden}", "backingFormat: raw", "persistent: true", "targetPVC: {claimName: delta}"}
		thinVMI = filepath.Join(root, "thin.yaml")
		thick := filepath.Join(root, "thick.yaml")
		Expect(os.WriteFile(thinVMI, []byte(testenv.OverlayVMI("thin-guest", "tests", volume,
			append(overlay, "thinProvisioning: {chunkSize: 4Mi, freeThreshold: 2Mi}")...)), 0o644)).To(Succeed())
		Expect(os.WriteFile(thick, []byte(testenv.OverlayVMI("thin-guest", "tests", volume, overlay...)), 0o644)).To(Succeed())
		launcher.VMI = thick
	}, NodeTimeout(15*time.Minute))

	It("refuses a non-thin overlay on the small device, naming the sizes, and leaves the device blank", func(ctx SpecContext) {
		_, stderr, err := launcher.Run(ctx, "-prepare")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(MatchRegexp(`overlay volume %s: .*target device %s of %d bytes cannot hold the overlay of a %d byte backing written in full \(\d+ bytes\)`,
			volume, testenv.OverlayTargetDevice(volume), deviceSize, virtualSize))
		head, err := testenv.ReadSectors(ctx, dev, "raw", 0, 128)
		Expect(err).ToNot(HaveOccurred())
		Expect(head).To(HaveEach(byte(0)))
	}, SpecTimeout(2*time.Minute))

	It("creates the thin overlay on it, its record in the qcow2 header", func(ctx SpecContext) {
		launcher.VMI = thinVMI
		_, err := launcher.Prepare(ctx)
		Expect(err).ToNot(HaveOccurred())
		Expect(testenv.DeviceSize(dev)).To(Equal(deviceSize))
		record, err := headerRecord(dev)
		Expect(err).ToNot(HaveOccurred())
		Expect(string(record)).To(ContainSubstring(`"backing":%q`, testenv.OverlayBackingImage(volume)))
		Expect(string(record)).To(ContainSubstring(`"backingFormat":"raw"`))
		check, err := qcow2.Tool{}.Check(ctx, dev, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
		Expect(err).ToNot(HaveOccurred())
		Expect(check.Clean()).To(BeTrue(), "qemu-img check: %+v", check)
	}, SpecTimeout(2*time.Minute))

	It("boots it, the Monitor asking for room chunk by chunk and resuming the guest that ran out of it", func(ctx SpecContext) {
		dom, err := launcher.Prepare(ctx)
		Expect(err).ToNot(HaveOccurred())
		Expect(dom.Devices.Disks).To(HaveLen(1))
		disk := dom.Devices.Disks[0]
		Expect(disk.Source.Block).ToNot(BeNil())
		Expect(disk.Source.Block.Dev).To(Equal(dev))
		Expect(disk.Driver.ErrorPolicy).To(Equal("stop"), "the converter pauses the guest on a full device")

		const name = "launcher-thin"
		DeferCleanup(func(ctx SpecContext) { Expect(env.Libvirtd.DestroyAndUndefine(ctx, name)).To(Succeed()) })
		Expect(env.Libvirtd.DefineAndStart(ctx, env.Libvirtd.NewDomain(name, disk))).To(Succeed())

		// The tool plays virt-launcher; this goroutine plays virt-controller
		// and the storage: it grows the device to each required size. It
		// holds the first growth back until the guest filled the device and
		// QEMU paused it, so that the Monitor's resume runs in every run.
		monitor := exec.Command(filepath.Join(tools, "thinmonitor"), "-uri", env.Libvirtd.URI(), "-domain", name, "-vmi", thinVMI, "-target", dev)
		monitor.Stderr = GinkgoWriter
		out, err := monitor.StdoutPipe()
		Expect(err).ToNot(HaveOccurred())
		Expect(monitor.Start()).To(Succeed())
		var (
			mu      sync.Mutex
			reports []thinReport
			grown   []int64
			growErr error
			paused  string
		)
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			lines := bufio.NewScanner(out)
			for lines.Scan() {
				var r thinReport
				Expect(json.Unmarshal(lines.Bytes(), &r)).To(Succeed())
				fmt.Fprintf(GinkgoWriter, "thinmonitor: %s\n", lines.Bytes())
				mu.Lock()
				reports = append(reports, r)
				for _, d := range r.Disks {
					size, err := testenv.DeviceSize(dev)
					if err == nil && d.RequiredSize > size && len(grown) == 0 {
						if err = env.Libvirtd.WaitForState(ctx, name, testenv.StatePaused); err == nil {
							_, paused, err = env.Libvirtd.DomainState(ctx, name)
						}
					}
					if err == nil && d.RequiredSize > size {
						err = testenv.GrowLoop(ctx, dev, loopFile, d.RequiredSize)
						grown = append(grown, d.RequiredSize)
					}
					if err != nil && growErr == nil {
						growErr = err
					}
				}
				mu.Unlock()
			}
		}()
		stopped := false
		stopMonitor := func() {
			if !stopped {
				stopped = true
				Expect(monitor.Process.Signal(syscall.SIGTERM)).To(Succeed())
				<-done
				Expect(monitor.Wait()).To(Succeed())
			}
		}
		DeferCleanup(stopMonitor)

		status, err := env.Libvirtd.WaitForGuest(ctx, name)
		Expect(err).ToNot(HaveOccurred())
		Expect(status.Failed).To(BeFalse(), "the guest saw a write error %#x", status.Err)
		Expect(status.Done).To(BeTrue())
		Expect(status.Written).To(Equal(writer.Sectors))
		// The launcher's monitor ends before its domain.
		stopMonitor()
		Expect(env.Libvirtd.DestroyAndUndefine(ctx, name)).To(Succeed())

		mu.Lock()
		defer mu.Unlock()
		Expect(growErr).ToNot(HaveOccurred())
		var pauses, resumes, requests int
		for _, r := range reports {
			Expect(r.Error).To(BeEmpty())
			for _, d := range r.Disks {
				Expect(d.Volume).To(Equal(volume))
				if d.PausedNoSpace {
					pauses++
				}
			}
			for _, e := range r.Events {
				switch e.Reason {
				case "ThinVolumeResumed":
					resumes++
				case "ThinVolumeExpansionRequired":
					requests++
				}
			}
		}
		By(fmt.Sprintf("the device grew %d times, to %v; paused (%s) in %d reports, %d resumes", len(grown), grown, paused, pauses, resumes))
		Expect(len(grown)).To(BeNumerically(">=", 4), "24 MiB written over a 4 MiB device in 4 MiB chunks")
		Expect(requests).To(BeNumerically(">=", len(grown)))
		for i, size := range grown {
			Expect(size % mib).To(BeZero())
			if i > 0 {
				Expect(size).To(BeNumerically(">", grown[i-1]))
				Expect(size-grown[i-1]).To(BeNumerically("<=", chunk+2*mib), "growth %d is about a chunk", i)
			}
		}
		Expect(paused).To(ContainSubstring("I/O error"), "QEMU paused the guest on the full device")
		Expect(pauses).To(BeNumerically(">=", 1), "the Monitor saw the guest paused for room")
		Expect(resumes).To(BeNumerically(">=", 1), "the Monitor resumed the guest once the device grew")
		size, err := testenv.DeviceSize(dev)
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(BeNumerically("<", virtualSize), "the device stays thin")

		_, err = headerRecord(dev)
		Expect(err).ToNot(HaveOccurred(), "the record survives QEMU's writes")
		check, err := qcow2.Tool{}.Check(ctx, dev, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
		Expect(err).ToNot(HaveOccurred())
		Expect(check.Clean()).To(BeTrue(), "qemu-img check: %+v", check)
		Expect(check.ImageEndOffset).To(BeNumerically("<=", size))
		Expect(testenv.VerifyGuestWrites(ctx, testenv.OverlayOver(dev, backing, "raw"), "", writer)).To(Succeed())
		Expect(testenv.SHA256(backing)).To(Equal(backingSum), "the backing changed")
	}, SpecTimeout(6*time.Minute))

	It("accepts the grown device on the next start, its data still there", func(ctx SpecContext) {
		before, err := testenv.DeviceSize(dev)
		Expect(err).ToNot(HaveOccurred())
		dom, err := launcher.Prepare(ctx)
		Expect(err).ToNot(HaveOccurred())
		Expect(dom.Devices.Disks[0].Source.Block.Dev).To(Equal(dev))
		Expect(testenv.DeviceSize(dev)).To(Equal(before))
		Expect(testenv.VerifyGuestWrites(ctx, testenv.OverlayOver(dev, backing, "raw"), "", writer)).To(Succeed())
		Expect(testenv.SHA256(backing)).To(Equal(backingSum))
	}, SpecTimeout(2*time.Minute))
})
