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

// Package testbed runs the test guest on a thin-provisioned qcow2 disk for
// the thin-provisioning suite and benchmark: a raw backing file holding the
// guest, a qcow2 overlay formatted straight onto a small loop device, a
// libvirt domain booting through it, and a thinp.Monitor growing the loop
// device in-process. Everything started is cleaned up with DeferCleanup.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp/libvirtdomain"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// Target is the guest disk's target device.
const Target = "vda"

// Env is what every guest of a suite shares: the private libvirtd and a
// client connection to it with a running event loop.
type Env struct {
	Libvirtd *testenv.Libvirtd
	Conn     *libvirt.Connect
}

// StartEnv starts the libvirt side of a suite; call it in BeforeSuite.
//
// Guests run under TCG unless testenv.VirtTypeEnv says otherwise: the
// test guest writes through BIOS calls, which nested KVM without hardware
// virtualization runs several times slower than TCG, and the write rate
// is what these suites are about.
func StartEnv(ctx context.Context) *Env {
	if os.Getenv(testenv.VirtTypeEnv) == "" {
		gomega.Expect(os.Setenv(testenv.VirtTypeEnv, "qemu")).To(gomega.Succeed())
	}
	// libvirt wants its event loop before the first connection.
	gomega.Expect(libvirtdomain.StartEventLoop()).To(gomega.Succeed())
	lv, err := testenv.StartLibvirtd(ctx)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		if lv != nil {
			gomega.Expect(lv.Stop(ctx)).To(gomega.Succeed())
		}
	})
	framework.Require(err, "a private libvirtd")
	conn, err := libvirt.NewConnect(lv.URI())
	framework.Require(err, "a libvirt client connection")
	ginkgo.DeferCleanup(func() { _, _ = conn.Close() })
	return &Env{Libvirtd: lv, Conn: conn}
}

// GuestOptions size one guest.
type GuestOptions struct {
	// Name of the domain.
	Name string
	// VirtualSize of the disk the guest sees.
	VirtualSize int64
	// DeviceSize is the loop device's size at the start.
	DeviceSize int64
	// Dir holds the backing file and the loop device's file; a tmpfs
	// (/dev/shm) keeps storage speed out of the measurements.
	Dir string
	// Writer tells the test guest what to write.
	Writer testenv.GuestParams
}

// Guest is a running domain whose disk is a qcow2 overlay on a loop device
// over a raw backing file.
type Guest struct {
	Env      *Env
	Opts     GuestOptions
	Device   string
	LoopFile string
	Base     string
	// BaseHash is the backing file's SHA-256 before the guest ran.
	BaseHash string
	// Maximum is the device size holding the fully allocated overlay.
	Maximum   int64
	destroyed bool
}

// StartGuest creates the images, attaches the loop device and starts the
// domain; the guest starts writing at once.
func (e *Env) StartGuest(ctx context.Context, o GuestOptions) *Guest {
	g := &Guest{Env: e, Opts: o, Base: filepath.Join(o.Dir, o.Name+"-base.raw"), LoopFile: filepath.Join(o.Dir, o.Name+"-thin.img")}
	gomega.Expect(testenv.CreateBootDisk(ctx, g.Base, o.VirtualSize, o.Writer)).To(gomega.Succeed())
	ginkgo.DeferCleanup(os.Remove, g.Base)
	var err error
	g.BaseHash, err = testenv.SHA256(g.Base)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())

	g.Device, err = testenv.CreateLoopFile(ctx, g.LoopFile, o.DeviceSize)
	ginkgo.DeferCleanup(os.Remove, g.LoopFile)
	framework.Require(err, "a loop device")
	ginkgo.DeferCleanup(func(ctx context.Context) {
		gomega.Expect(testenv.DetachLoop(ctx, g.Device)).To(gomega.Succeed())
	})
	gomega.Expect(qcow2.Tool{}.CreateOverlay(ctx, g.Device, g.Base, qcow2.FormatRaw, qcow2.CreateOptions{})).To(gomega.Succeed())
	g.Maximum, err = thinp.MaximumSizeOf(ctx, qcow2.Tool{}, g.Device)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())

	disk := testenv.WithBackingFile(testenv.BlockDisk(g.Device, qcow2.FormatQcow2, Target), g.Base, qcow2.FormatRaw)
	// Pause the guest on any write error, as a thin disk must.
	disk.Driver.ErrorPolicy = "stop"
	disk.Driver.Cache = "none"
	disk.Driver.IO = "native"
	dom := e.Libvirtd.NewDomain(o.Name, disk)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		if !g.destroyed {
			gomega.Expect(e.Libvirtd.DestroyAndUndefine(ctx, o.Name)).To(gomega.Succeed())
		}
	})
	gomega.Expect(e.Libvirtd.DefineAndStart(ctx, dom)).To(gomega.Succeed())
	return g
}

// DomainXML is the guest's live domain XML.
func (g *Guest) DomainXML(ctx context.Context) *libvirtxml.Domain {
	out, err := g.Env.Libvirtd.Virsh(ctx, "dumpxml", g.Opts.Name)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	var dom libvirtxml.Domain
	gomega.Expect(dom.Unmarshal(out)).To(gomega.Succeed())
	return &dom
}

// Wait waits for the guest to finish writing and expects it to succeed.
func (g *Guest) Wait(ctx context.Context) {
	status, err := g.Env.Libvirtd.WaitForGuest(ctx, g.Opts.Name)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	gomega.Expect(status.Failed).To(gomega.BeFalse(), "the guest saw a write error %#x", status.Err)
	gomega.Expect(status.Done).To(gomega.BeTrue())
	gomega.Expect(status.Written).To(gomega.Equal(g.Opts.Writer.Sectors))
}

// Usage is what libvirt reports about the disk.
func (g *Guest) Usage() thinp.Usage {
	dom, err := g.Env.Conn.LookupDomainByName(g.Opts.Name)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	defer dom.Free()
	info, err := dom.GetBlockInfo(Target, 0)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	return thinp.Usage{Allocation: int64(info.Allocation), Physical: int64(info.Physical), Capacity: int64(info.Capacity)}
}

// Verify stops the domain and checks what a user would: the overlay on
// the device is consistent, it holds everything the guest wrote, and the
// backing file is untouched.
func (g *Guest) Verify(ctx context.Context) {
	gomega.Expect(g.Env.Libvirtd.DestroyAndUndefine(ctx, g.Opts.Name)).To(gomega.Succeed())
	g.destroyed = true
	check, err := qcow2.Tool{}.Check(ctx, g.Device, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	gomega.Expect(check.Clean()).To(gomega.BeTrue(), "qemu-img check of the thin overlay: %+v", check)
	size, err := testenv.DeviceSize(g.Device)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	gomega.Expect(check.ImageEndOffset).To(gomega.BeNumerically("<=", size))
	gomega.Expect(testenv.VerifyGuestWrites(ctx, g.Device, qcow2.FormatQcow2, g.Opts.Writer)).To(gomega.Succeed())
	gomega.Expect(testenv.SHA256(g.Base)).To(gomega.Equal(g.BaseHash), "the backing file changed")
}

// Monitor is a thinp.Monitor running in the test process, recording what it
// does.
type Monitor struct {
	*thinp.Monitor
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	exts   []thinp.Extension
}

// MonitorOptions change how a Monitor sees the domain.
type MonitorOptions struct {
	Policy thinp.Policy
	// WrapDomain, when set, stands between the Monitor and the domain,
	// e.g. to lose events.
	WrapDomain func(thinp.Domain) thinp.Domain
	// WrapExtender, when set, stands between the Monitor and the loop
	// device, e.g. to make extensions slow.
	WrapExtender func(thinp.Extender) thinp.Extender
}

// StartMonitor starts a Monitor for the guest's disk; it runs until Stop or
// the end of the spec.
func (g *Guest) StartMonitor(o MonitorOptions) *Monitor {
	adapter, err := libvirtdomain.New(g.Env.Conn, g.Opts.Name)
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	var dom thinp.Domain = adapter
	if o.WrapDomain != nil {
		dom = o.WrapDomain(dom)
	}
	var ext thinp.Extender = &thinp.LoopExtender{Device: g.Device, BackingFile: g.LoopFile}
	if o.WrapExtender != nil {
		ext = o.WrapExtender(ext)
	}
	m := &Monitor{done: make(chan error, 1)}
	m.Monitor, err = thinp.NewMonitor(thinp.Config{
		Domain: dom,
		Disks:  []thinp.Disk{{Target: Target, Device: g.Device, Maximum: g.Maximum, Extender: ext}},
		Policy: o.Policy,
		Logger: logger(),
		Observe: func(e thinp.Extension) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.exts = append(m.exts, e)
		},
	})
	gomega.Expect(err).ToNot(gomega.HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		err := m.Run(ctx)
		m.done <- errors.Join(err, adapter.Close())
	}()
	ginkgo.DeferCleanup(m.Stop)
	return m
}

// Stop stops the Monitor and waits for it; stopping twice does nothing.
func (m *Monitor) Stop() {
	m.cancel()
	if err, ok := <-m.done; ok {
		gomega.Expect(err).ToNot(gomega.HaveOccurred())
		close(m.done)
	}
}

// Extensions lists the extensions so far.
func (m *Monitor) Extensions() []thinp.Extension {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]thinp.Extension(nil), m.exts...)
}

// Triggers lists what started each extension so far.
func (m *Monitor) Triggers() []thinp.Trigger {
	var t []thinp.Trigger
	for _, e := range m.Extensions() {
		t = append(t, e.Trigger)
	}
	return t
}

// Failed lists the failed extensions.
func (m *Monitor) Failed() []error {
	var errs []error
	for _, e := range m.Extensions() {
		if e.Err != nil {
			errs = append(errs, fmt.Errorf("extension to %d: %w", e.Size, e.Err))
		}
	}
	return errs
}
