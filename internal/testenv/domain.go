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

package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"
)

// DomainState is a state as `virsh domstate` names it.
type DomainState string

// Domain states, as virsh names them.
const (
	StateRunning DomainState = "running"
	StatePaused  DomainState = "paused"
	StateShutOff DomainState = "shut off"
)

// guestMemoryMiB is plenty for SeaBIOS and a boot sector.
const guestMemoryMiB = 32

// NewDomain builds a minimal x86 guest for the daemon: 1 vCPU, little RAM,
// ACPI, COM1 into SerialLog(name), no graphics, USB or balloon. It boots
// from the first disk: that disk gets boot order 1 unless a disk already
// has one. Callers may change the result before DefineAndStart.
func (d *Libvirtd) NewDomain(name string, disks ...libvirtxml.DomainDisk) *libvirtxml.Domain {
	disks = append([]libvirtxml.DomainDisk(nil), disks...)
	hasBootOrder := false
	for _, disk := range disks {
		hasBootOrder = hasBootOrder || disk.Boot != nil
	}
	if !hasBootOrder && len(disks) > 0 {
		disks[0].Boot = &libvirtxml.DomainDeviceBoot{Order: 1}
	}
	port := uint(0)
	usbIndex := uint(0)
	return &libvirtxml.Domain{
		Type:   d.VirtType(),
		Name:   name,
		Memory: &libvirtxml.DomainMemory{Value: guestMemoryMiB, Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		OnPoweroff: "destroy",
		OnReboot:   "destroy",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: disks,
			Controllers: []libvirtxml.DomainController{
				{Type: "usb", Index: &usbIndex, Model: "none"},
			},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{
					File: &libvirtxml.DomainChardevSourceFile{Path: d.SerialLog(name)},
				},
				Target: &libvirtxml.DomainSerialTarget{Port: &port},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
}

// FileDisk is a virtio disk backed by an image file.
func FileDisk(path, format, target string) libvirtxml.DomainDisk {
	return libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
		Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
		Target: &libvirtxml.DomainDiskTarget{Dev: target, Bus: "virtio"},
	}
}

// BlockDisk is a virtio disk backed by a block device holding an image.
func BlockDisk(dev, format, target string) libvirtxml.DomainDisk {
	return libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
		Source: &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: dev}},
		Target: &libvirtxml.DomainDiskTarget{Dev: target, Bus: "virtio"},
	}
}

// WithBackingFile returns disk with an explicit <backingStore>: the image
// file at path in format, which itself has no backing.
func WithBackingFile(disk libvirtxml.DomainDisk, path, format string) libvirtxml.DomainDisk {
	disk.BackingStore = &libvirtxml.DomainDiskBackingStore{
		Format:       &libvirtxml.DomainDiskFormat{Type: format},
		Source:       &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path}},
		BackingStore: &libvirtxml.DomainDiskBackingStore{},
	}
	return disk
}

// SerialLog is the file NewDomain sends the guest's COM1 to.
func (d *Libvirtd) SerialLog(name string) string {
	return filepath.Join(d.dir, "domains", name+".serial")
}

// QEMULog is the daemon's log of a domain's QEMU (command line, errors).
func (d *Libvirtd) QEMULog(name string) string {
	return filepath.Join(d.dir, "log", "qemu", name+".log")
}

// ReadSerial returns what the guest printed so far; nothing if its serial
// file does not exist yet.
func (d *Libvirtd) ReadSerial(name string) (string, error) {
	b, err := os.ReadFile(d.SerialLog(name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read serial of %s: %w", name, err)
	}
	return string(b), nil
}

// DefineAndStart defines the domain persistently and starts it.
func (d *Libvirtd) DefineAndStart(ctx context.Context, dom *libvirtxml.Domain) error {
	xml, err := dom.Marshal()
	if err != nil {
		return fmt.Errorf("marshal domain %s: %w", dom.Name, err)
	}
	path := filepath.Join(d.dir, "domains", dom.Name+".xml")
	if err := os.WriteFile(path, []byte(xml), 0o644); err != nil {
		return fmt.Errorf("define domain %s: %w", dom.Name, err)
	}
	if _, err := d.Virsh(ctx, "define", path); err != nil {
		return fmt.Errorf("define domain %s: %w", dom.Name, err)
	}
	if _, err := d.Virsh(ctx, "start", dom.Name); err != nil {
		return fmt.Errorf("start domain %s: %w", dom.Name, err)
	}
	return nil
}

// DestroyAndUndefine stops the domain if it runs (QEMU gets SIGTERM first,
// so it flushes its images) and removes its definition. A domain that is
// gone, or a daemon that was stopped, leaves nothing to do: cleanups may
// run after a test already did this.
func (d *Libvirtd) DestroyAndUndefine(ctx context.Context, name string) error {
	if d.stopped.Load() {
		return nil
	}
	names, err := d.Virsh(ctx, "list", "--all", "--name")
	if err != nil {
		return fmt.Errorf("destroy domain %s: %w", name, err)
	}
	if !slices.Contains(strings.Fields(names), name) {
		return nil
	}
	state, _, err := d.DomainState(ctx, name)
	if err != nil {
		return err
	}
	if state != StateShutOff {
		if _, err := d.Virsh(ctx, "destroy", name); err != nil {
			return fmt.Errorf("destroy domain %s: %w", name, err)
		}
	}
	// Checkpoints (left by backup tests) would otherwise refuse the undefine.
	if _, err := d.Virsh(ctx, "undefine", "--checkpoints-metadata", name); err != nil {
		return fmt.Errorf("undefine domain %s: %w", name, err)
	}
	return nil
}

// DomainState returns the domain's state and libvirt's reason for it
// (e.g. "paused", "I/O error").
func (d *Libvirtd) DomainState(ctx context.Context, name string) (DomainState, string, error) {
	out, err := d.Virsh(ctx, "domstate", "--reason", name)
	if err != nil {
		return "", "", fmt.Errorf("state of domain %s: %w", name, err)
	}
	state, reason, _ := strings.Cut(strings.TrimSpace(out), " (")
	return DomainState(state), strings.TrimSuffix(reason, ")"), nil
}

// WaitForState waits until the domain is in state.
func (d *Libvirtd) WaitForState(ctx context.Context, name string, state DomainState) error {
	var last DomainState
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		var err error
		last, _, err = d.DomainState(ctx, name)
		return last == state, err
	})
	if err != nil {
		return fmt.Errorf("wait for domain %s to be %s (last %q): %w", name, state, last, err)
	}
	return nil
}

// WaitForGuest waits until the test guest in the domain reports DONE or an
// error on its serial console and returns its final status.
func (d *Libvirtd) WaitForGuest(ctx context.Context, name string) (GuestStatus, error) {
	var status GuestStatus
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		serial, err := d.ReadSerial(name)
		status = ParseGuestStatus(WholeLines(serial))
		return status.Finished(), err
	})
	if err != nil {
		return status, fmt.Errorf("wait for the guest in %s to finish (%+v): %w", name, status, err)
	}
	return status, nil
}

// QMP runs a QMP command in the domain's QEMU and returns its "return"
// value; arguments may be nil.
func (d *Libvirtd) QMP(ctx context.Context, name, command string, arguments any) (json.RawMessage, error) {
	req, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, arguments})
	if err != nil {
		return nil, fmt.Errorf("QMP %s on %s: %w", command, name, err)
	}
	out, err := d.Virsh(ctx, "qemu-monitor-command", name, string(req))
	if err != nil {
		return nil, fmt.Errorf("QMP %s on %s: %w", command, name, err)
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		return nil, fmt.Errorf("QMP %s on %s: parse %q: %w", command, name, out, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("QMP %s on %s: %s: %s", command, name, resp.Error.Class, resp.Error.Desc)
	}
	return resp.Return, nil
}

// HMP runs a human monitor command in the domain's QEMU and returns its
// output.
func (d *Libvirtd) HMP(ctx context.Context, name, command string) (string, error) {
	out, err := d.Virsh(ctx, "qemu-monitor-command", "--hmp", name, command)
	if err != nil {
		return "", fmt.Errorf("HMP %q on %s: %w", command, name, err)
	}
	return out, nil
}
