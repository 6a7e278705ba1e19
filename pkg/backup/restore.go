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
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// NotFoundError says the store holds no such backup, no such VM in the
// backup, or no complete checkpoint of the VM.
type NotFoundError struct{ Reason string }

func (e *NotFoundError) Error() string { return e.Reason }

// IsNotFound reports whether err says the store does not hold what was
// asked for.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}

// ResolveChain returns the checkpoints, base first, that restore vm as
// backup saved it, after checking the backup's manifests against the VM's
// index. An empty backup means the VM's latest complete checkpoint. What
// the store does not hold is looked for in the legacy store.
func (r *Repository) ResolveChain(ctx context.Context, backup string, vm catalog.VM) ([]catalog.CheckpointEntry, error) {
	_, chain, err := r.locate(ctx, backup, vm)
	return chain, err
}

// locate resolves the chain in the store, else in the legacy store, and
// returns a repository on the store that holds it.
func (r *Repository) locate(ctx context.Context, backup string, vm catalog.VM) (*Repository, []catalog.CheckpointEntry, error) {
	chain, err := r.resolveChain(ctx, backup, vm)
	if r.Legacy == nil || !IsNotFound(err) {
		return r, chain, err
	}
	legacy := r.on(r.Legacy)
	if chain, lerr := legacy.resolveChain(ctx, backup, vm); !IsNotFound(lerr) {
		return legacy, chain, lerr
	}
	return r, nil, err
}

func (r *Repository) resolveChain(ctx context.Context, backup string, vm catalog.VM) ([]catalog.CheckpointEntry, error) {
	idx, err := r.Catalog.VMIndex(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("resolve chain of %s: %w", vm, err)
	}
	if backup == "" {
		latest := idx.Latest()
		if len(latest) == 0 {
			return nil, fmt.Errorf("resolve chain of %s: %w", vm, &NotFoundError{Reason: "no complete checkpoint in the store"})
		}
		return idx.Chain(latest[0].ID)
	}
	m, found, err := r.Catalog.BackupManifest(ctx, backup)
	if err != nil {
		return nil, fmt.Errorf("resolve chain of %s in backup %s: %w", vm, backup, err)
	}
	if !found {
		return nil, fmt.Errorf("resolve chain of %s: %w", vm, &NotFoundError{Reason: "backup " + backup + " is not in the store"})
	}
	var entry *catalog.BackupVM
	for i := range m.VMs {
		if m.VMs[i].Namespace == vm.Namespace && m.VMs[i].Name == vm.Name {
			entry = &m.VMs[i]
		}
	}
	if entry == nil {
		return nil, fmt.Errorf("resolve chain of %s: %w", vm, &NotFoundError{Reason: "backup " + backup + " does not hold this VM"})
	}
	vmm, err := r.Catalog.VMManifest(ctx, entry.ManifestPath)
	if err != nil {
		return nil, fmt.Errorf("resolve chain of %s in backup %s: %w", vm, backup, err)
	}
	chain, err := idx.Chain(entry.CheckpointID)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", backup, err)
	}
	if ids := catalog.IDs(chain); !slices.Equal(ids, vmm.CheckpointChain) {
		return nil, fmt.Errorf("backup %s: %w", backup, &catalog.ChainError{VM: vm, Checkpoint: entry.CheckpointID,
			Reason: fmt.Sprintf("the backup's manifest lists chain %v, the index %v", vmm.CheckpointChain, ids)})
	}
	return chain, nil
}

// RestoreOptions say what to restore where.
type RestoreOptions struct {
	// Backup names the backup; empty restores the VM's latest checkpoint.
	Backup string
	VM     catalog.VM
	// Disk is the disk's name in the checkpoint files (e.g. "vda").
	Disk string
	// Target is a raw file (created or replaced) or a block device of at
	// least the disk's size (written in place) that receives the disk.
	Target string
	// WorkDir holds the downloaded layers when the chain is restored
	// through staged copies (see Restore); it then needs room for the
	// whole chain of the disk. Empty means the system's temporary
	// directory.
	WorkDir  string
	Progress Progress
	// SkipVerify skips comparing the target with the rebuilt chain after
	// a staged restore.
	SkipVerify bool
}

// RestoreResult describes a finished restore.
type RestoreResult struct {
	Chain []string
	// Bytes is what was downloaded.
	Bytes       int64
	VirtualSize int64
}

// Restore writes the disk as the chain of its backup holds it onto the
// target, in one pass over each layer: it reads the qcow2 metadata of
// every layer with ranged reads (qcow2meta.ReadMap), gives each guest range
// to the topmost layer that holds it, makes the ranges no layer holds
// with data read as zeroes, then streams each layer once, writing the
// ranges the guest reads from it to their place in the target while it
// checks the layer's size and sha256 and that its metadata are those it
// was mapped from. A layer read otherwise than the index records it starts
// the restore over (Repository.Retries attempts); the target of a failed
// restore holds no disk to trust.
//
// A chain whose map needs more than Repository.MaxRestoreExtents ranges
// is restored through staged copies instead: every layer is downloaded
// into WorkDir and checked, and qemu-img converts the chain onto the
// target (restoreStaged).
func (r *Repository) Restore(ctx context.Context, opts RestoreOptions) (*RestoreResult, error) {
	src, chain, err := r.locate(ctx, opts.Backup, opts.VM)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", opts.VM, err)
	}
	res := &RestoreResult{Chain: catalog.IDs(chain)}
	files := make([]*catalog.FileEntry, len(chain))
	for i, c := range chain {
		if files[i] = c.File(opts.Disk); files[i] == nil {
			return nil, fmt.Errorf("restore %s: checkpoint %s has no disk %s", opts.VM, c.ID, opts.Disk)
		}
		res.Bytes += files[i].Size
	}
	res.VirtualSize, err = src.restoreStreamed(ctx, chain, files, opts.Target, opts.Progress)
	if errors.Is(err, qcow2meta.ErrTooManyExtents) {
		logr.FromContextOrDiscard(ctx).Info("Restoring through staged copies of the layers", "vm", opts.VM.String(), "disk", opts.Disk, "reason", err.Error())
		res.VirtualSize, err = src.restoreStaged(ctx, chain, files, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("restore %s disk %s: %w", opts.VM, opts.Disk, err)
	}
	return res, nil
}

// restoreStaged downloads the layers, files of the checkpoints of chain,
// into a work directory, checking each object's size and digest; checks
// that the base has no backing file, that every incremental has one and
// that none uses an external data file; points every layer at the one
// before it (rebase -u); converts the top to raw onto the target and
// compares the two. It returns the disk's virtual size.
func (r *Repository) restoreStaged(ctx context.Context, chain []catalog.CheckpointEntry, files []*catalog.FileEntry, opts RestoreOptions) (int64, error) {
	work, err := os.MkdirTemp(opts.WorkDir, "restore-")
	if err != nil {
		return 0, fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)

	var prev string
	var size int64
	for i, c := range chain {
		f := files[i]
		local := filepath.Join(work, fmt.Sprintf("%03d-%s.qcow2", i, c.ID))
		if err := r.fetchLayer(ctx, f.ObjectPath, local, f, opts.Progress); err != nil {
			return 0, fmt.Errorf("checkpoint %s: %w", c.ID, err)
		}
		info, err := r.Qemu.Info(ctx, local, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
		if err != nil {
			return 0, fmt.Errorf("checkpoint %s: %w", c.ID, err)
		}
		want := catalog.Incremental
		if i == 0 {
			want = catalog.Full
		}
		if err := checkLayer(info, want); err != nil {
			return 0, fmt.Errorf("layer %d (checkpoint %s): %w", i, c.ID, err)
		}
		if i > 0 {
			if err := r.Qemu.Rebase(ctx, local, prev, qcow2.FormatQcow2); err != nil {
				return 0, fmt.Errorf("checkpoint %s: %w", c.ID, err)
			}
		}
		check, err := r.Qemu.Check(ctx, local, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
		if err != nil {
			return 0, fmt.Errorf("checkpoint %s: %w", c.ID, err)
		}
		if !check.Clean() {
			return 0, fmt.Errorf("checkpoint %s: qemu-img check finds %d errors, %d corruptions",
				c.ID, check.CheckErrors, check.Corruptions)
		}
		size = info.VirtualSize
		prev = local
	}
	if err := r.Qemu.Convert(ctx, prev, qcow2.FormatQcow2, opts.Target, qcow2.FormatRaw); err != nil {
		return 0, err
	}
	if !opts.SkipVerify {
		same, err := r.Qemu.Compare(ctx, opts.Target, qcow2.FormatRaw, prev, qcow2.FormatQcow2)
		if err != nil {
			return 0, fmt.Errorf("verify: %w", err)
		}
		if !same {
			return 0, fmt.Errorf("%s differs from the rebuilt chain", opts.Target)
		}
	}
	return size, nil
}

// fetchLayer downloads one object to a new local file and checks it.
func (r *Repository) fetchLayer(ctx context.Context, key, local string, f *catalog.FileEntry, progress Progress) error {
	out, err := os.OpenFile(local, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	// Reserving the whole layer at once fails early when the work
	// directory is too small, and spares the file system an allocation
	// per write: on ext4, appending 1 MiB writes to a file grown write by
	// write costs several times what the same writes into reserved space
	// do. A file system without fallocate grows the file as it is written.
	if err := unix.Fallocate(int(out.Fd()), 0, 0, f.Size); errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		out.Close()
		return fmt.Errorf("download %s: no room for its %d bytes in %s: %w", key, f.Size, filepath.Dir(local), err)
	}
	err = r.downloadFile(ctx, key, out, f.Size, f.SHA256, progress)
	if cerr := out.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("download %s: %w", key, cerr)
	}
	return err
}

// IsCorrupt reports whether err says a stored object is missing or not
// what the index recorded.
func IsCorrupt(err error) bool {
	var oe *ObjectError
	return errors.As(err, &oe)
}
