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

// Package overlaydemo shows overlay volumes working on one machine without
// Kubernetes: the patched virt-launcher converter turns three VMIs with
// overlay volumes over one golden image into domains, a private libvirtd
// boots them with a guest that writes a known pattern, and every claim
// (writes stay in each VM's overlay, the golden image never changes, a
// persistent overlay survives a restart, ephemeral ones do not) is checked
// on the bytes, then everything is torn down.
package overlaydemo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// Options says where the demo writes.
type Options struct {
	// OutDir receives the VMI manifests, the domain XML, the disk usage
	// table and chart, and keeps vmi2domain for the next run.
	OutDir string
	// WorkDir holds the images and the stand-ins for the pods' and the
	// node's directories; empty for a new temporary directory. It is
	// removed at the end unless KeepImages.
	WorkDir string
	// KeepImages leaves WorkDir and the images in it, ephemeral overlays
	// included, as the last table shows them, for inspection.
	KeepImages bool
	// Log receives the numbered steps and the tables.
	Log io.Writer
}

const (
	mib        = 1 << 20
	sector     = testenv.SectorSize
	volume     = "rootdisk"
	goldenSize = 256 * mib
	// The golden image holds data from 1 MiB on, standing in for an
	// installed system (sector 0 is the guest).
	goldenDataOffset = 1 * mib
	goldenDataSize   = 95 * mib
	teardownTimeout  = 2 * time.Minute
)

var (
	// goldenGuest is what the golden image's own guest writes: what a VM
	// with a fresh overlay and no parameters of its own does.
	goldenGuest = testenv.GuestParams{StartLBA: 200 * mib / sector, Sectors: 1 * mib / sector, Seed: 0x60}
	// persistentSecondBoot writes elsewhere, so both boots' data must be in
	// the persistent overlay after the restart.
	persistentSecondBoot = testenv.GuestParams{StartLBA: 160 * mib / sector, Sectors: 4 * mib / sector, Seed: 0xc4}
)

// vm is one VMI with one overlay volume, run as virt-launcher would.
type vm struct {
	name       string
	persistent bool
	// guest is what the VM's guest writes on its first boot; every VM
	// writes over the same golden data with its own pattern.
	guest    testenv.GuestParams
	launcher testenv.Launcher
	overlay  string // the overlay image on this host
	disk     libvirtxml.DomainDisk
	// created identifies the overlay file the first pre-start step made.
	created os.FileInfo
	defined bool
}

func (v *vm) kind() string {
	if v.persistent {
		return "persistent"
	}
	return "ephemeral"
}

type demo struct {
	Options
	start  time.Time
	step   int
	tool   testenv.VMI2Domain
	lv     *testenv.Libvirtd
	golden string
	sum    string
	vms    []*vm
	usage  [][]diskUsage // one table per moment
}

// Run runs the demo. It tears everything down before it returns, also on
// failure or cancellation.
func Run(ctx context.Context, opts Options) (err error) {
	d := &demo{Options: opts, start: time.Now()}
	if err := d.preflight(); err != nil {
		return err
	}
	if d.OutDir, err = filepath.Abs(d.OutDir); err != nil {
		return err
	}
	if err := os.MkdirAll(d.OutDir, 0o755); err != nil {
		return err
	}
	if d.WorkDir == "" {
		if d.WorkDir, err = os.MkdirTemp("", "overlay-demo-"); err != nil {
			return err
		}
	} else {
		// Host paths in a VMI are absolute.
		if d.WorkDir, err = filepath.Abs(d.WorkDir); err != nil {
			return err
		}
		if err := os.Mkdir(d.WorkDir, 0o755); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), teardownTimeout)
		defer cancel()
		err = errors.Join(err, d.teardown(tctx))
	}()
	for _, stage := range []func(context.Context) error{
		d.buildTool, d.makeGolden, d.startLibvirtd, d.convert, d.personalize, d.boot,
		d.checkIsolation, d.checkGolden, d.measure, d.launcherTeardown, d.prepareAgain, d.reboot,
		d.checkAfterRestart, d.checkGolden, d.measure, d.chart,
	} {
		if err := stage(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", err)
			}
			return err
		}
	}
	return nil
}

// say prints one numbered step with the time since the start.
func (d *demo) say(format string, args ...any) {
	d.step++
	fmt.Fprintf(d.Log, "%2d. [%5.1fs] %s\n", d.step, time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// preflight names what is missing before anything is created.
func (d *demo) preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root: it runs a private libvirtd in a mount namespace of its own")
	}
	var missing []string
	for _, cmd := range []string{"qemu-img", "qemu-io", "qemu-system-x86_64", "libvirtd", "virsh", "unshare", "nsenter", "as", "ld", "go"} {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run `make` (hack/install-deps.sh installs them)", strings.Join(missing, ", "))
	}
	tree := testenv.KubeVirtTree()
	if _, err := os.Stat(filepath.Join(tree, "pkg", "storage", "overlay", "overlay.go")); err != nil {
		return fmt.Errorf("no patched KubeVirt tree at %s (its overlay package is missing): run `make` first, or set KUBEVIRT_TREE", tree)
	}
	d.say("found root, QEMU, libvirt, binutils and the patched KubeVirt tree %s", relative(tree))
	return nil
}

// relative names path from the current directory when it lies beneath it.
func relative(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	return relativeTo(wd, path)
}

func relativeTo(dir, path string) string {
	rel, err := filepath.Rel(dir, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return path
	}
	return rel
}

// buildTool builds vmi2domain into the output directory: a binary that is
// up to date with the tree is not linked again, which saves most of the
// build on the next run.
func (d *demo) buildTool(ctx context.Context) error {
	dir := filepath.Join(d.OutDir, "bin")
	var err error
	if d.tool, err = testenv.BuildVMI2Domain(ctx, dir); err != nil {
		return err
	}
	d.say("built vmi2domain inside the patched tree into %s: the patched virt-launcher converter and overlay steps", relative(dir))
	return nil
}

func (d *demo) makeGolden(ctx context.Context) error {
	dir := filepath.Join(d.WorkDir, "node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	d.golden = filepath.Join(dir, "golden.raw")
	if err := testenv.CreateBootDisk(ctx, d.golden, goldenSize, goldenGuest); err != nil {
		return err
	}
	fill := fmt.Sprintf("write -q -P 0x5a %d %d", goldenDataOffset, goldenDataSize)
	if _, err := testenv.QemuIO(ctx, d.golden, "raw", fill); err != nil {
		return err
	}
	var err error
	if d.sum, err = testenv.SHA256(d.golden); err != nil {
		return err
	}
	d.say("golden image %s in the work directory %s: %d MiB raw, a bootable guest in sector 0, %d MiB of data; sha256 %.16s…",
		relativeTo(d.WorkDir, d.golden), d.WorkDir, goldenSize/mib, goldenDataSize/mib, d.sum)
	return nil
}

func (d *demo) startLibvirtd(ctx context.Context) error {
	var err error
	if d.lv, err = testenv.StartLibvirtd(ctx); err != nil {
		return err
	}
	d.say("started a private libvirtd in its own mount namespace (domain type %s, %s=kvm|qemu chooses)",
		d.lv.VirtType(), testenv.VirtTypeEnv)
	return nil
}

// convert writes the three VMIs and has the patched converter make their
// domains; the pre-start step creates their overlays.
func (d *demo) convert(ctx context.Context) error {
	d.vms = []*vm{
		{name: "vm-a", guest: testenv.GuestParams{StartLBA: 2 * mib / sector, Sectors: 4 * mib / sector, Seed: 0xa1}},
		{name: "vm-b", guest: testenv.GuestParams{StartLBA: 2 * mib / sector, Sectors: 8 * mib / sector, Seed: 0xb2}},
		{name: "vm-c", persistent: true, guest: testenv.GuestParams{StartLBA: 2 * mib / sector, Sectors: 12 * mib / sector, Seed: 0xc3}},
	}
	var lines []string
	for _, v := range d.vms {
		if err := d.writeVMI(v); err != nil {
			return err
		}
		dom, err := v.launcher.Prepare(ctx)
		if err != nil {
			return err
		}
		if len(dom.Devices.Disks) != 1 {
			return fmt.Errorf("%s: the converter made %d disks, want 1", v.name, len(dom.Devices.Disks))
		}
		v.disk = dom.Devices.Disks[0]
		if err := checkOverlayDisk(v, d.golden); err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %s", v.name, v.kind()))
	}
	d.say("converted the VMIs (%s): each disk is a qcow2 overlay with the golden image as its raw backingStore; overlays created",
		strings.Join(lines, ", "))
	return nil
}

// writeVMI writes v's manifest and sets up its launcher: its pod's
// directories, and the golden image (and the persistent target directory)
// at the paths where the kubelet would mount the host paths.
func (d *demo) writeVMI(v *vm) error {
	pod := filepath.Join(d.WorkDir, "pods", v.name)
	v.launcher = testenv.Launcher{
		Tool: d.tool,
		VMI:  filepath.Join(d.OutDir, v.name+".vmi.yaml"),
		Maps: map[string]string{
			testenv.LauncherPrivateDir:          filepath.Join(pod, "private"),
			testenv.LauncherEphemeralDir:        filepath.Join(pod, "ephemeral"),
			testenv.OverlayBackingImage(volume): d.golden,
		},
	}
	overlay := []string{"backingHostPath: {path: " + d.golden + "}", "backingFormat: raw"}
	v.overlay = v.launcher.Host(testenv.OverlayEphemeralImage(volume))
	if v.persistent {
		// The node directory a cluster would allow: <prefix>/<namespace>/<VM name>/<volume name>.
		target := filepath.Join(d.WorkDir, "node", "demo", v.name, volume)
		v.launcher.Maps[testenv.OverlayTargetDir(volume)] = target
		v.overlay = filepath.Join(target, "disk.qcow2")
		overlay = append(overlay, "persistent: true", "targetHostPath: {path: "+target+"}")
	}
	manifest := testenv.OverlayVMI(v.name, "demo", volume, overlay...)
	return os.WriteFile(v.launcher.VMI, []byte(manifest), 0o644)
}

// checkOverlayDisk checks what the converter made of v's volume and
// records which file the new overlay is.
func checkOverlayDisk(v *vm, golden string) error {
	disk := v.disk
	switch {
	case disk.Driver == nil || disk.Driver.Type != "qcow2":
		return fmt.Errorf("%s: the converter's disk is not qcow2: %+v", v.name, disk.Driver)
	case disk.Source == nil || disk.Source.File == nil || disk.Source.File.File != v.overlay:
		return fmt.Errorf("%s: the converter's disk is not the overlay %s: %+v", v.name, v.overlay, disk.Source)
	case disk.BackingStore == nil || disk.BackingStore.Source == nil || disk.BackingStore.Source.File == nil ||
		disk.BackingStore.Source.File.File != golden || disk.BackingStore.Format == nil || disk.BackingStore.Format.Type != "raw":
		return fmt.Errorf("%s: the converter's disk has no raw backingStore %s", v.name, golden)
	}
	info, err := os.Stat(v.overlay)
	if err != nil {
		return fmt.Errorf("%s: the pre-start step made no overlay: %w", v.name, err)
	}
	v.created = info
	return nil
}

// personalize gives each VM its own guest parameters, written into its
// overlay's sector 0, as per-VM configuration would be.
func (d *demo) personalize(ctx context.Context) error {
	var lines []string
	for _, v := range d.vms {
		if err := testenv.WriteBootSector(ctx, testenv.OverlayOver(v.overlay, d.golden, "raw"), "", v.guest); err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %s", v.name, describe(v.guest)))
	}
	d.say("wrote each VM's guest parameters into sector 0 of its overlay: %s", strings.Join(lines, "; "))
	return nil
}

func describe(p testenv.GuestParams) string {
	return fmt.Sprintf("%d MiB at %d MiB, seed %#x", int64(p.Sectors)*sector/mib, int64(p.StartLBA)*sector/mib, p.Seed)
}

// boot defines the three domains from the converter's disks, starts them
// together and waits for every guest to finish, then stops them; the
// definitions stay.
func (d *demo) boot(ctx context.Context) error {
	for _, v := range d.vms {
		dom := d.lv.NewDomain(v.name, v.disk)
		xml, err := dom.Marshal()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d.OutDir, v.name+".xml"), []byte(xml), 0o644); err != nil {
			return err
		}
		v.defined = true
		if err := d.lv.DefineAndStart(ctx, dom); err != nil {
			return err
		}
	}
	took, err := d.waitAndStop(ctx)
	if err != nil {
		return err
	}
	d.say("defined and started %s under the private libvirtd; every guest booted through its overlay, wrote and reported DONE (%.1fs); stopped them",
		d.names(), took.Seconds())
	return nil
}

func (d *demo) names() string {
	var names []string
	for _, v := range d.vms {
		names = append(names, v.name)
	}
	return strings.Join(names, ", ")
}

// waitAndStop waits for every guest to report DONE, then stops the
// domains (QEMU flushes its images on the way out).
func (d *demo) waitAndStop(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	for _, v := range d.vms {
		status, err := d.lv.WaitForGuest(ctx, v.name)
		if err != nil {
			return 0, err
		}
		if !status.Done {
			return 0, fmt.Errorf("%s: the guest failed: %+v (serial in %s)", v.name, status, d.lv.SerialLog(v.name))
		}
	}
	took := time.Since(start)
	for _, v := range d.vms {
		if _, err := d.lv.Virsh(ctx, "destroy", v.name); err != nil {
			return 0, err
		}
	}
	return took, nil
}

// checkIsolation reads each overlay alone: it holds its own VM's pattern
// and none of the others'.
func (d *demo) checkIsolation(ctx context.Context) error {
	for _, v := range d.vms {
		alone := qcow2.WithoutBacking(v.overlay, qcow2.FormatQcow2)
		if err := testenv.VerifyGuestWrites(ctx, alone, "", v.guest); err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		for _, other := range d.vms {
			if other != v && testenv.VerifyGuestWrites(ctx, alone, "", other.guest) == nil {
				return fmt.Errorf("%s's overlay holds %s's writes", v.name, other.name)
			}
		}
	}
	d.say("read each overlay alone (without its backing): each holds its own guest's pattern and none of the others'")
	return nil
}

// checkGolden compares the golden image's checksum with the one taken
// when it was made, and looks for the VMs' writes in it.
func (d *demo) checkGolden(ctx context.Context) error {
	sum, err := testenv.SHA256(d.golden)
	if err != nil {
		return err
	}
	if sum != d.sum {
		return fmt.Errorf("the golden image changed: sha256 %s, was %s", sum, d.sum)
	}
	for _, v := range d.vms {
		if testenv.VerifyGuestWrites(ctx, d.golden, "raw", v.guest) == nil {
			return fmt.Errorf("the golden image holds %s's writes", v.name)
		}
	}
	d.say("golden image unchanged: sha256 %.16s… as before, none of the VMs' writes in it", sum)
	return nil
}

// launcherTeardown runs virt-launcher's teardown step: ephemeral overlays
// go, the persistent one stays.
func (d *demo) launcherTeardown(ctx context.Context) error {
	for _, v := range d.vms {
		if err := v.launcher.Cleanup(ctx); err != nil {
			return err
		}
		_, err := os.Stat(v.overlay)
		switch {
		case v.persistent && err != nil:
			return fmt.Errorf("%s: the teardown step removed the persistent overlay: %w", v.name, err)
		case !v.persistent && err == nil:
			return fmt.Errorf("%s: the teardown step left the ephemeral overlay %s", v.name, v.overlay)
		}
	}
	d.say("ran the launcher's teardown step: the ephemeral overlays of vm-a and vm-b are gone, vm-c's persistent overlay stays")
	return nil
}

// prepareAgain runs the pre-start step again, as for a restart: the
// persistent overlay is validated and reused, the ephemeral ones are new.
func (d *demo) prepareAgain(ctx context.Context) error {
	for _, v := range d.vms {
		dom, err := v.launcher.Prepare(ctx)
		if err != nil {
			return err
		}
		if len(dom.Devices.Disks) != 1 || !reflect.DeepEqual(dom.Devices.Disks[0], v.disk) {
			return fmt.Errorf("%s: the converter made a different disk on the restart", v.name)
		}
		if v.persistent {
			info, err := os.Stat(v.overlay)
			if err != nil {
				return err
			}
			if !os.SameFile(info, v.created) {
				return fmt.Errorf("%s: the persistent overlay %s was made anew", v.name, v.overlay)
			}
			if err := testenv.VerifyGuestWrites(ctx, qcow2.WithoutBacking(v.overlay, qcow2.FormatQcow2), "", v.guest); err != nil {
				return fmt.Errorf("%s: the persistent overlay lost its data: %w", v.name, err)
			}
		} else if err := checkEmpty(ctx, v.overlay, v.guest); err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
	}
	d.say("ran the pre-start step again: same disks as before; vm-c's overlay validated and reused (the same file) with its data, vm-a's and vm-b's new and empty")
	return nil
}

// checkEmpty checks that an overlay holds nothing where the guest wrote.
func checkEmpty(ctx context.Context, overlay string, p testenv.GuestParams) error {
	data, err := testenv.ReadSectors(ctx, qcow2.WithoutBacking(overlay, qcow2.FormatQcow2), "", p.StartLBA, uint64(p.Sectors))
	if err != nil {
		return err
	}
	for _, b := range data {
		if b != 0 {
			return fmt.Errorf("the new overlay %s is not empty", overlay)
		}
	}
	return nil
}

// reboot starts the three domains again from their definitions. vm-c gets
// new guest parameters that write elsewhere; vm-a and vm-b boot the golden
// image's own guest, as a fresh VM does.
func (d *demo) reboot(ctx context.Context) error {
	for _, v := range d.vms {
		if v.persistent {
			if err := testenv.WriteBootSector(ctx, testenv.OverlayOver(v.overlay, d.golden, "raw"), "", persistentSecondBoot); err != nil {
				return err
			}
		}
		// A fresh serial file: the guest's report of this boot alone.
		if err := os.Remove(d.lv.SerialLog(v.name)); err != nil {
			return err
		}
		if _, err := d.lv.Virsh(ctx, "start", v.name); err != nil {
			return err
		}
	}
	took, err := d.waitAndStop(ctx)
	if err != nil {
		return err
	}
	d.say("started the same domains again (vm-c writing %s; vm-a and vm-b running the golden image's guest, %s); all DONE (%.1fs); stopped them",
		describe(persistentSecondBoot), describe(goldenGuest), took.Seconds())
	return nil
}

func (d *demo) checkAfterRestart(ctx context.Context) error {
	for _, v := range d.vms {
		alone := qcow2.WithoutBacking(v.overlay, qcow2.FormatQcow2)
		if v.persistent {
			for _, p := range []testenv.GuestParams{v.guest, persistentSecondBoot} {
				if err := testenv.VerifyGuestWrites(ctx, alone, "", p); err != nil {
					return fmt.Errorf("%s after the restart: %w", v.name, err)
				}
			}
			continue
		}
		if err := testenv.VerifyGuestWrites(ctx, alone, "", goldenGuest); err != nil {
			return fmt.Errorf("%s after the restart: %w", v.name, err)
		}
		if err := checkEmpty(ctx, v.overlay, v.guest); err != nil {
			return fmt.Errorf("%s after the restart: its first boot's writes came back: %w", v.name, err)
		}
	}
	d.say("vm-c's overlay holds both boots' writes; vm-a's and vm-b's hold only this boot's, their first boot is gone")
	return nil
}

// teardown removes everything the demo made except the output directory,
// and checks that nothing is left.
func (d *demo) teardown(ctx context.Context) error {
	var errs []error
	if d.lv != nil {
		for _, v := range d.vms {
			if v.defined {
				errs = append(errs, d.lv.DestroyAndUndefine(ctx, v.name))
			}
		}
		errs = append(errs, d.lv.Stop(ctx))
		if _, err := os.Stat(d.lv.Dir()); err == nil {
			errs = append(errs, fmt.Errorf("the private libvirtd left %s", d.lv.Dir()))
		}
	}
	if !d.KeepImages {
		for _, v := range d.vms {
			if v.launcher.Tool != "" {
				errs = append(errs, v.launcher.Cleanup(ctx))
			}
		}
	}
	mounts, err := testenv.MountPoints()
	errs = append(errs, err)
	for _, m := range mounts {
		if d.WorkDir != "" && strings.HasPrefix(m.MountPoint+"/", d.WorkDir+"/") {
			errs = append(errs, fmt.Errorf("%s is still mounted", m.MountPoint))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("teardown (work directory %s left): %w", d.WorkDir, err)
	}
	kept := "removed the work directory"
	if d.KeepImages {
		kept = "kept the images in " + d.WorkDir
	} else if d.WorkDir != "" {
		if err := os.RemoveAll(d.WorkDir); err != nil {
			return fmt.Errorf("teardown: %w", err)
		}
	}
	d.say("tore down: domains undefined, libvirtd and its QEMUs stopped, no mounts left, %s; output in %s", kept, relative(d.OutDir))
	return nil
}
