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

package backup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
)

// Hypervisor takes checkpoints and backups of a running VM's disks: libvirt
// in the CLI (package domain), KubeVirt's VirtualMachineBackup in a
// cluster.
type Hypervisor interface {
	// Checkpoints lists the checkpoints the hypervisor can take an
	// incremental backup from.
	Checkpoints(ctx context.Context) ([]string, error)
	// Backup creates checkpoint and writes one qcow2 file per disk into
	// dir: the whole disk when parent is empty, else what changed since
	// parent. It returns the file of each disk.
	Backup(ctx context.Context, checkpoint, parent, dir string) (map[string]string, error)
}

// BackupOptions describe one backup of one VM.
type BackupOptions struct {
	// Backup names the backup; it is what restore and delete take.
	Backup string
	// Checkpoint names the new checkpoint; empty means
	// "<backup>-<UTC time>".
	Checkpoint string
	Plan       PlanOptions
	// WorkDir receives the hypervisor's files until they are uploaded.
	WorkDir  string
	Progress Progress
}

// BackupResult describes a finished backup of a VM.
type BackupResult struct {
	Checkpoint catalog.CheckpointEntry
	Plan       Plan
	// Uploaded is the bytes sent.
	Uploaded int64
}

// BackupVM backs up vm through hv: it plans full or incremental, records
// the pending checkpoint, has the hypervisor write the files, uploads and
// commits them. On failure the pending checkpoint is aborted; what abort
// cannot remove is left to garbage collection.
func (r *Repository) BackupVM(ctx context.Context, vm catalog.VM, hv Hypervisor, opts BackupOptions) (*BackupResult, error) {
	cps, err := hv.Checkpoints(ctx)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", vm, err)
	}
	planOpts := opts.Plan
	planOpts.HypervisorCheckpoints = cps
	plan, err := r.Plan(ctx, vm, planOpts)
	if err != nil {
		return nil, err
	}
	id := opts.Checkpoint
	if id == "" {
		id = opts.Backup + "-" + r.now().Format("20060102-150405.000")
	}
	up, err := r.Begin(ctx, vm, CheckpointSpec{ID: id, Type: plan.Type, Parent: plan.Parent, Backup: opts.Backup})
	if err != nil {
		return nil, err
	}
	res, err := r.runBackup(ctx, up, hv, opts)
	if err != nil {
		abortCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if aerr := up.Abort(abortCtx); aerr != nil {
			return nil, fmt.Errorf("%w (abort: %v)", err, aerr) //nolint:errorlint // the first error is the cause; the second, only told
		}
		return nil, err
	}
	res.Plan = *plan
	return res, nil
}

func (r *Repository) runBackup(ctx context.Context, up *Upload, hv Hypervisor, opts BackupOptions) (*BackupResult, error) {
	spec := up.Spec()
	dir, err := os.MkdirTemp(opts.WorkDir, "backup-")
	if err != nil {
		return nil, fmt.Errorf("backup %s: work directory: %w", up.vm, err)
	}
	defer os.RemoveAll(dir)
	files, err := hv.Backup(ctx, spec.ID, spec.Parent, dir)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", up.vm, err)
	}
	disks := make([]string, 0, len(files))
	for d := range files {
		disks = append(disks, d)
	}
	sort.Strings(disks)
	res := &BackupResult{}
	for _, d := range disks {
		f, err := up.PutDisk(ctx, d, files[d], opts.Progress)
		if err != nil {
			return nil, fmt.Errorf("backup %s: %w", up.vm, err)
		}
		res.Uploaded += f.Size
		// The local copy is no longer needed; free the space early.
		_ = os.Remove(filepath.Clean(files[d]))
	}
	entry, err := up.Commit(ctx)
	if err != nil {
		return nil, err
	}
	res.Checkpoint = *entry
	return res, nil
}

// Index reads a VM's checkpoint index.
func (r *Repository) Index(ctx context.Context, vm catalog.VM) (*catalog.VMIndex, error) {
	return r.Catalog.VMIndex(ctx, vm)
}

// VMs lists the VMs with checkpoints in the store.
func (r *Repository) VMs(ctx context.Context) ([]catalog.VM, error) {
	return r.Catalog.VMs(ctx)
}

// Backups reads every backup's manifest.
func (r *Repository) Backups(ctx context.Context) ([]catalog.BackupManifest, error) {
	names, err := r.Catalog.Backups(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]catalog.BackupManifest, 0, len(names))
	for _, n := range names {
		m, found, err := r.Catalog.BackupManifest(ctx, n)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, *m)
		}
	}
	return out, nil
}
