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

package mover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// ProgressFunc is told how many of total bytes have moved, over all files.
// total is what the transfer moves, known and told before the first byte
// moves (done 0), as Velero's own uploaders set TotalBytes up front.
type ProgressFunc func(done, total int64)

// UploadedFile is one disk file stored by an upload.
type UploadedFile struct {
	Disk   string `json:"disk"`
	Object string `json:"object"`
	Size   int64  `json:"size"`
}

// UploadResult is what an upload pod reports in its termination message.
type UploadResult struct {
	Checkpoint string                 `json:"checkpoint"`
	Type       catalog.CheckpointType `json:"type"`
	Parent     string                 `json:"parent,omitempty"`
	// Path is the checkpoint's directory relative to the datamover's root.
	Path  string         `json:"path"`
	Bytes int64          `json:"bytes"`
	Files []UploadedFile `json:"files"`
}

// RestoreResult is what a restore pod reports in its termination message.
type RestoreResult struct {
	Chain       []string `json:"chain"`
	Bytes       int64    `json:"bytes"`
	VirtualSize int64    `json:"virtualSize"`
}

// Repository opens the backup storage location a pod was given.
func Repository(bsl []byte, credentials string) (*backup.Repository, error) {
	cfg, err := objectstore.ParseBSL(bsl)
	if err != nil {
		return nil, fmt.Errorf("backup storage location: %w", err)
	}
	cfg.CredentialsFile = credentials
	repo, err := backup.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("backup storage location: %w", err)
	}
	return repo, nil
}

// FindDiskFile locates the file KubeVirt wrote for volume in a push-mode
// backup: "<source>/<vmi>/<checkpoint dir>/<vmbackup>-<volume>.qcow2". The
// temporary volume is fresh for every backup, so exactly one must match.
func FindDiskFile(source, vmBackup, volume string) (string, error) {
	pattern := filepath.Join(source, "*", "*", vmBackup+"-"+volume+".qcow2")
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return "", fmt.Errorf("find the file of volume %s: %w", volume, err)
	}
	switch len(matches) {
	case 0:
		return "", fmt.Errorf("volume %s: no file %s-%s.qcow2 on the backup volume", volume, vmBackup, volume)
	case 1:
		return matches[0], nil
	default:
		return "", fmt.Errorf("volume %s: %d files match %s-%s.qcow2 on the backup volume", volume, len(matches), vmBackup, volume)
	}
}

// Upload records the checkpoint as pending, streams every disk's file,
// archives the VirtualMachineBackup and its tracker beside it and commits.
// On failure the pending checkpoint is aborted (best effort; garbage
// collection removes what remains). An upload retried after its commit
// landed reports the stored checkpoint.
func Upload(ctx context.Context, repo *backup.Repository, o UploadOptions, progress ProgressFunc) (*UploadResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	files := make([]string, len(o.Disks))
	var total int64
	for i, d := range o.Disks {
		f, err := FindDiskFile(o.Source, o.VMBackup, d.Volume)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(f)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", d.Volume, err)
		}
		files[i], total = f, total+st.Size()
	}
	pvcs := make([]string, 0, len(o.Disks))
	for _, d := range o.Disks {
		pvcs = append(pvcs, d.Name)
	}
	sort.Strings(pvcs)
	spec := backup.CheckpointSpec{ID: o.Checkpoint, Type: o.Type, Parent: o.Parent, Backup: o.Backup,
		VMBackup: o.VMBackup, PVCs: pvcs, PVCSizes: o.DiskSizes}
	up, err := repo.Begin(ctx, o.VM, spec)
	if errors.Is(err, backup.ErrCheckpointExists) {
		return storedResult(ctx, repo, o)
	}
	if err != nil {
		return nil, err
	}
	res, err := uploadFiles(ctx, up, o, files, total, progress)
	if err != nil {
		if abortErr := up.Abort(context.WithoutCancel(ctx)); abortErr != nil {
			return nil, fmt.Errorf("%w (abort: %v)", err, abortErr) //nolint:errorlint // the first error is the cause; the second, only told
		}
		return nil, err
	}
	return res, nil
}

func uploadFiles(ctx context.Context, up *backup.Upload, o UploadOptions, files []string, total int64, progress ProgressFunc) (*UploadResult, error) {
	if progress != nil {
		progress(0, total)
	}
	report := sumProgress(total, progress)
	for i, d := range o.Disks {
		if _, err := up.PutDisk(ctx, d.Name, files[i], report); err != nil {
			return nil, fmt.Errorf("upload volume %s: %w", d.Volume, err)
		}
	}
	for name, data := range map[string][]byte{backup.AttachmentVMBackup: o.VMBackupJSON, backup.AttachmentVMBackupTracker: o.TrackerJSON} {
		if len(data) == 0 {
			continue
		}
		if _, err := up.PutAttachment(ctx, name, data); err != nil {
			return nil, fmt.Errorf("archive %s: %w", name, err)
		}
	}
	entry, err := up.Commit(ctx)
	if err != nil {
		return nil, err
	}
	if progress != nil {
		progress(total, total)
	}
	return resultOf(o.VM, entry), nil
}

func storedResult(ctx context.Context, repo *backup.Repository, o UploadOptions) (*UploadResult, error) {
	idx, err := repo.Index(ctx, o.VM)
	if err != nil {
		return nil, err
	}
	entry := idx.Checkpoint(o.Checkpoint)
	if entry == nil {
		return nil, fmt.Errorf("checkpoint %s of %s vanished from the index", o.Checkpoint, o.VM)
	}
	return resultOf(o.VM, entry), nil
}

func resultOf(vm catalog.VM, e *catalog.CheckpointEntry) *UploadResult {
	res := &UploadResult{Checkpoint: e.ID, Type: e.Type, Parent: e.Parent, Path: catalog.CheckpointDir(vm, e.ID)}
	for _, f := range e.Files {
		res.Files = append(res.Files, UploadedFile{Disk: f.DiskName, Object: f.ObjectPath, Size: f.Size})
		res.Bytes += f.Size
	}
	return res
}

// Restore rebuilds one disk of a VM as a backup saved it onto o.Target.
func Restore(ctx context.Context, repo *backup.Repository, o RestoreOptions, progress ProgressFunc) (*RestoreResult, error) {
	chain, err := repo.ResolveChain(ctx, o.Backup, o.VM)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, c := range chain {
		found := false
		for _, f := range c.Files {
			if f.DiskName == o.Disk {
				total += f.Size
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("backup %s of %s has no disk %s in checkpoint %s", o.Backup, o.VM, o.Disk, c.ID)
		}
	}
	if progress != nil {
		progress(0, total)
	}
	report := sumProgress(total, progress)
	res, err := repo.Restore(ctx, backup.RestoreOptions{Backup: o.Backup, VM: o.VM, Disk: o.Disk,
		Target: o.Target, WorkDir: o.WorkDir, Progress: report})
	if err != nil {
		return nil, err
	}
	if progress != nil {
		progress(total, total)
	}
	return &RestoreResult{Chain: res.Chain, Bytes: res.Bytes, VirtualSize: res.VirtualSize}, nil
}

// EncodeResult renders a result for the termination message.
func EncodeResult(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode result: %w", err)
	}
	return string(b), nil
}

// DecodeUploadResult reads an upload pod's termination message.
func DecodeUploadResult(msg string) (*UploadResult, error) {
	var r UploadResult
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return nil, fmt.Errorf("upload pod's result %q: %w", msg, err)
	}
	if r.Checkpoint == "" {
		return nil, fmt.Errorf("upload pod's result %q names no checkpoint", msg)
	}
	return &r, nil
}

// DecodeRestoreResult reads a restore pod's termination message.
func DecodeRestoreResult(msg string) (*RestoreResult, error) {
	var r RestoreResult
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return nil, fmt.Errorf("restore pod's result %q: %w", msg, err)
	}
	return &r, nil
}

// sumProgress turns per-object progress from concurrent transfers into
// progress over all of them.
func sumProgress(total int64, progress ProgressFunc) func(object string, n, _ int64) {
	var (
		mu   sync.Mutex
		done = map[string]int64{}
	)
	return func(object string, n, _ int64) {
		if progress == nil {
			return
		}
		mu.Lock()
		done[object] = n
		var sum int64
		for _, v := range done {
			sum += v
		}
		mu.Unlock()
		progress(sum, total)
	}
}
