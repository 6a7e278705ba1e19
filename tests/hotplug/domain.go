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

package hotplug

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// bootGuest keeps the guest's own writes short: it only has to be running.
var bootGuest = testenv.GuestParams{StartLBA: 1, Sectors: 8, Seed: 3}

// StartDomain starts a domain running the framework's BIOS guest with a
// virtio-scsi controller, as KubeVirt gives every VMI for hotplug, and
// waits until the guest has booted.
func StartDomain(ctx context.Context, lv *testenv.Libvirtd, dir, name string) error {
	boot := filepath.Join(dir, name+"-boot.raw")
	if err := testenv.CreateBootDisk(ctx, boot, 16<<20, bootGuest); err != nil {
		return err
	}
	dom := lv.NewDomain(name, testenv.FileDisk(boot, "raw", "vda"))
	index := uint(0)
	dom.Devices.Controllers = append(dom.Devices.Controllers, libvirtxml.DomainController{
		Type: "scsi", Index: &index, Model: "virtio-scsi",
	})
	if err := lv.DefineAndStart(ctx, dom); err != nil {
		return err
	}
	status, err := lv.WaitForGuest(ctx, name)
	if err != nil {
		return err
	}
	if !status.Done || status.Failed {
		return fmt.Errorf("guest in %s: %+v", name, status)
	}
	return nil
}

// Attach hot-attaches a disk with the flags virt-launcher uses (live and
// config).
func Attach(ctx context.Context, lv *testenv.Libvirtd, domain, diskXML string) error {
	return deviceCommand(ctx, lv, "attach-device", domain, diskXML)
}

// Detach hot-detaches a disk as virt-launcher does once its volume left
// the spec.
func Detach(ctx context.Context, lv *testenv.Libvirtd, domain, diskXML string) error {
	return deviceCommand(ctx, lv, "detach-device", domain, diskXML)
}

func deviceCommand(ctx context.Context, lv *testenv.Libvirtd, command, domain, diskXML string) error {
	f, err := os.CreateTemp("", "disk-*.xml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(diskXML); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = lv.Virsh(ctx, command, domain, f.Name(), "--live", "--config")
	return err
}

// DomainDisks returns the disks of the running domain as libvirt has them.
func DomainDisks(ctx context.Context, lv *testenv.Libvirtd, domain string) ([]libvirtxml.DomainDisk, error) {
	out, err := lv.Virsh(ctx, "dumpxml", domain)
	if err != nil {
		return nil, err
	}
	dom := &libvirtxml.Domain{}
	if err := dom.Unmarshal(out); err != nil {
		return nil, err
	}
	return dom.Devices.Disks, nil
}

// QEMUDisk is a disk device of a running QEMU as query-block reports it.
type QEMUDisk struct {
	QDev     string `json:"qdev"`
	Inserted *struct {
		NodeName string `json:"node-name"`
		ReadOnly bool   `json:"ro"`
		Image    struct {
			Filename     string `json:"filename"`
			BackingImage *struct {
				Filename string `json:"filename"`
			} `json:"backing-image"`
		} `json:"image"`
	} `json:"inserted"`
}

// QueryDevice returns the disk device whose qdev id is device.
func QueryDevice(ctx context.Context, lv *testenv.Libvirtd, domain, device string) (QEMUDisk, error) {
	out, err := lv.QMP(ctx, domain, "query-block", nil)
	if err != nil {
		return QEMUDisk{}, err
	}
	var devices []QEMUDisk
	if err := json.Unmarshal(out, &devices); err != nil {
		return QEMUDisk{}, fmt.Errorf("query-block: %w", err)
	}
	for _, d := range devices {
		if d.QDev == device && d.Inserted != nil {
			return d, nil
		}
	}
	return QEMUDisk{}, fmt.Errorf("no disk %s in %s: %s", device, domain, out)
}

// CompareDeviceContent compares what QEMU reads through a disk device with
// a raw image: QEMU exports the device's block node read-only over NBD on a
// socket in dir (which must be visible to it) and qemu-img compares the
// export with want.
func CompareDeviceContent(ctx context.Context, lv *testenv.Libvirtd, domain, device, dir, want string) error {
	d, err := QueryDevice(ctx, lv, domain, device)
	if err != nil {
		return err
	}
	socket := filepath.Join(dir, "nbd.sock")
	if _, err := lv.QMP(ctx, domain, "nbd-server-start", map[string]any{
		"addr": map[string]any{"type": "unix", "data": map[string]any{"path": socket}},
	}); err != nil {
		return err
	}
	defer lv.QMP(context.WithoutCancel(ctx), domain, "nbd-server-stop", nil) //nolint:errcheck // cleanup of the comparison; the result is already taken
	if _, err := lv.QMP(ctx, domain, "block-export-add", map[string]any{
		"type": "nbd", "id": "compare", "node-name": d.Inserted.NodeName, "name": device, "writable": false,
	}); err != nil {
		return err
	}
	defer lv.QMP(context.WithoutCancel(ctx), domain, "block-export-del", map[string]any{"id": "compare"}) //nolint:errcheck // cleanup of the comparison; the result is already taken
	_, err = testenv.QemuImg(ctx, "compare", "-f", "raw", "-F", "raw", fmt.Sprintf("nbd+unix:///%s?socket=%s", device, socket), want)
	return err
}
