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

// Package domain takes checkpoints and push-mode backups of a running
// libvirt domain's qcow2 disks: a full backup, or an incremental one since
// an earlier checkpoint, written as one qcow2 file per disk.
package domain

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// Domain is one libvirt domain whose disks are backed up.
type Domain struct {
	conn *libvirt.Connect
	name string
	// Disks limits the backup to these targets (e.g. "vda"); empty means
	// every qcow2 disk of the domain.
	Disks []string
	// PollInterval is how often a running backup job is polled; zero
	// means 100 ms.
	PollInterval time.Duration
}

// Open connects to uri and finds the domain called name.
func Open(uri, name string) (*Domain, error) {
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", uri, err)
	}
	d := &Domain{conn: conn, name: name}
	dom, err := d.lookup()
	if err != nil {
		conn.Close()
		return nil, err
	}
	dom.Free()
	return d, nil
}

// Close releases the connection.
func (d *Domain) Close() error {
	if _, err := d.conn.Close(); err != nil {
		return fmt.Errorf("close connection: %w", err)
	}
	return nil
}

func (d *Domain) lookup() (*libvirt.Domain, error) {
	dom, err := d.conn.LookupDomainByName(d.name)
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", d.name, err)
	}
	return dom, nil
}

// Checkpoints lists the domain's checkpoints by name.
func (d *Domain) Checkpoints(ctx context.Context) ([]string, error) {
	dom, err := d.lookup()
	if err != nil {
		return nil, err
	}
	defer dom.Free()
	cps, err := dom.ListAllCheckpoints(0)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of %s: %w", d.name, err)
	}
	names := make([]string, 0, len(cps))
	for i := range cps {
		name, err := cps[i].GetName()
		cps[i].Free()
		if err != nil {
			return nil, fmt.Errorf("list checkpoints of %s: %w", d.name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// qcow2Disks returns the targets of the domain's qcow2 disks.
func (d *Domain) qcow2Disks(dom *libvirt.Domain) ([]string, []string, error) {
	desc, err := dom.GetXMLDesc(0)
	if err != nil {
		return nil, nil, fmt.Errorf("describe %s: %w", d.name, err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(desc); err != nil {
		return nil, nil, fmt.Errorf("parse description of %s: %w", d.name, err)
	}
	var chosen, other []string
	if def.Devices == nil {
		return nil, nil, fmt.Errorf("domain %s has no devices", d.name)
	}
	for _, disk := range def.Devices.Disks {
		if disk.Target == nil || (disk.Device != "" && disk.Device != "disk") {
			continue
		}
		isQcow2 := disk.Driver != nil && disk.Driver.Type == "qcow2"
		if isQcow2 && (len(d.Disks) == 0 || slices.Contains(d.Disks, disk.Target.Dev)) {
			chosen = append(chosen, disk.Target.Dev)
		} else {
			other = append(other, disk.Target.Dev)
		}
	}
	for _, want := range d.Disks {
		if !slices.Contains(chosen, want) {
			return nil, nil, fmt.Errorf("domain %s has no qcow2 disk %s", d.name, want)
		}
	}
	if len(chosen) == 0 {
		return nil, nil, fmt.Errorf("domain %s has no qcow2 disk to back up", d.name)
	}
	return chosen, other, nil
}

// Backup creates checkpoint and, in the same step, a push-mode backup of
// the disks into dir: everything when parent is empty, otherwise what
// changed since checkpoint parent. It waits for the job and returns each
// disk's file. The incremental files name the live disk as their backing
// file, as libvirt writes them.
func (d *Domain) Backup(ctx context.Context, checkpoint, parent, dir string) (map[string]string, error) {
	dom, err := d.lookup()
	if err != nil {
		return nil, err
	}
	defer dom.Free()
	disks, others, err := d.qcow2Disks(dom)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	push := &libvirtxml.DomainBackupPushDisks{}
	cp := &libvirtxml.DomainCheckpointDisks{}
	for _, dev := range disks {
		file := filepath.Join(dir, checkpoint+"-"+dev+".qcow2")
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("backup %s: %w", d.name, err)
		}
		files[dev] = file
		push.Disks = append(push.Disks, libvirtxml.DomainBackupPushDisk{
			Name: dev, Backup: "yes",
			Driver: &libvirtxml.DomainBackupDiskDriver{Type: "qcow2"},
			Target: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: file}},
		})
		cp.Disks = append(cp.Disks, libvirtxml.DomainCheckpointDisk{Name: dev, Checkpoint: "bitmap"})
	}
	for _, dev := range others {
		push.Disks = append(push.Disks, libvirtxml.DomainBackupPushDisk{Name: dev, Backup: "no"})
		cp.Disks = append(cp.Disks, libvirtxml.DomainCheckpointDisk{Name: dev, Checkpoint: "no"})
	}
	backupXML, err := (&libvirtxml.DomainBackup{Incremental: parent, Push: &libvirtxml.DomainBackupPush{Disks: push}}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("backup %s: encode backup: %w", d.name, err)
	}
	checkpointXML, err := (&libvirtxml.DomainCheckpoint{Name: checkpoint, Disks: cp}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("backup %s: encode checkpoint: %w", d.name, err)
	}
	if err := dom.BackupBegin(backupXML, checkpointXML, 0); err != nil {
		return nil, fmt.Errorf("backup %s to checkpoint %s: %w", d.name, checkpoint, err)
	}
	if err := d.wait(ctx, dom); err != nil {
		return nil, fmt.Errorf("backup %s to checkpoint %s: %w", d.name, checkpoint, err)
	}
	return files, nil
}

// wait polls the domain's job until the backup ends, and aborts it when
// ctx ends first.
func (d *Domain) wait(ctx context.Context, dom *libvirt.Domain) error {
	interval := d.PollInterval
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		job, err := dom.GetJobStats(0)
		if err != nil {
			return fmt.Errorf("poll job: %w", err)
		}
		if job.Type == libvirt.DOMAIN_JOB_NONE {
			break
		}
		select {
		case <-ctx.Done():
			if err := dom.AbortJob(); err != nil {
				return fmt.Errorf("%w (and abort failed: %v)", ctx.Err(), err) //nolint:errorlint // the first error is the cause; the second, only told
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
	done, err := dom.GetJobStats(libvirt.DOMAIN_JOB_STATS_COMPLETED)
	if err != nil {
		return fmt.Errorf("job result: %w", err)
	}
	switch done.Type {
	case libvirt.DOMAIN_JOB_COMPLETED:
		return nil
	case libvirt.DOMAIN_JOB_FAILED, libvirt.DOMAIN_JOB_CANCELLED:
		msg := "no message"
		if done.ErrorMessageSet {
			msg = done.ErrorMessage
		}
		return fmt.Errorf("job ended as %d: %s", done.Type, msg)
	}
	return fmt.Errorf("job ended in unexpected state %d", done.Type)
}
