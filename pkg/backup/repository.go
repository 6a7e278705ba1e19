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

// Package backup keeps incremental qcow2 backups of virtual machines in an
// object store: it decides whether the next backup of a VM can be
// incremental, uploads a checkpoint's disk files and records them, restores
// a disk from its chain of checkpoints, and removes what no backup needs.
//
// The steps are separate so that the parties of a Velero data mover can
// each run theirs: a controller plans (Plan) before it asks KubeVirt for a
// VirtualMachineBackup, an upload pod records the intent (Begin), streams
// the files (Upload.PutDisk) and commits them (Upload.Commit), a restore
// pod rebuilds a disk (Restore), and a delete action collects garbage
// (DeleteBackup). BackupVM runs them all against a Hypervisor, as the CLI
// does with libvirt.
package backup

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// Repository is the backups of every VM in one backup storage location.
type Repository struct {
	Store   objectstore.Store
	Catalog *catalog.Catalog
	Qemu    qcow2.Tool
	// Now stamps checkpoints; nil means time.Now.
	Now func() time.Time
	// Retries bounds the attempts of one transfer; zero means 3.
	Retries int
	// RetryDelay is the first pause between attempts, doubled for each
	// later one; zero means 1 s.
	RetryDelay time.Duration
	// ProgressInterval is how often a transfer reports its progress;
	// zero means DefaultProgressInterval.
	ProgressInterval time.Duration
	// MaxRestoreExtents caps the ranges a restore maps the chain of a
	// disk with; a chain that needs more is restored through staged
	// copies of its layers. Zero means DefaultMaxRestoreExtents.
	MaxRestoreExtents int
	// Legacy, when set, is a store where earlier releases kept backups
	// (catalog.LegacyRoot). ResolveChain and Restore read a backup there
	// when Store does not hold it; nothing is written there.
	Legacy objectstore.Store
}

// NewRepository returns a Repository on store, whose keys are relative to
// the datamover's root (catalog.Root).
func NewRepository(store objectstore.Store) *Repository {
	return &Repository{Store: store, Catalog: catalog.New(store)}
}

// Open returns the repository of the backup storage location cfg
// describes: its bucket at catalog.Root(cfg.Prefix), beside the prefix
// Velero owns, with the backups earlier releases wrote under the prefix
// (catalog.LegacyRoot) still restorable.
func Open(cfg objectstore.Config) (*Repository, error) {
	s3, err := objectstore.NewS3(cfg)
	if err != nil {
		return nil, err
	}
	r := NewRepository(s3.At(catalog.Root(cfg.Prefix)))
	r.Legacy = s3.At(catalog.LegacyRoot(cfg.Prefix))
	return r, nil
}

// on is r reading and writing store instead.
func (r *Repository) on(store objectstore.Store) *Repository {
	c := *r
	cat := *r.Catalog
	cat.Store = store
	c.Store, c.Catalog, c.Legacy = store, &cat, nil
	return &c
}

func (r *Repository) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

// PlanOptions steer the choice between a full and an incremental backup.
type PlanOptions struct {
	// ForceFull asks for a full backup whatever the store holds.
	ForceFull bool
	// MaxChainLength caps the layers of a chain, the full base included:
	// a backup that would make the chain longer is full. Zero means no cap.
	MaxChainLength int
	// HypervisorCheckpoints are the checkpoints the hypervisor still has
	// (its dirty bitmaps); the parent must be one of them. Nil skips the
	// check.
	HypervisorCheckpoints []string
	// VerifyContent reads every object of the chain and checks its
	// digest, rather than only its presence, size and ETag.
	VerifyContent bool
}

// Plan is the decision for the next backup of a VM.
type Plan struct {
	Type catalog.CheckpointType
	// Parent is the checkpoint an incremental backup starts from.
	Parent string
	// Chain is the parent's chain, base first (empty for a full backup).
	Chain []catalog.CheckpointEntry
	// Reason says why the backup is full, for events and logs.
	Reason string
}

// Plan decides whether the next backup of vm can be incremental: the latest
// complete checkpoint must be known to the hypervisor, its chain complete
// and consistent in the index, shorter than the cap, and every object of it
// present and as recorded. Anything else means a full backup, with the
// reason.
func (r *Repository) Plan(ctx context.Context, vm catalog.VM, opts PlanOptions) (*Plan, error) {
	full := func(reason string) (*Plan, error) {
		return &Plan{Type: catalog.Full, Reason: reason}, nil
	}
	if opts.ForceFull {
		return full("full backup forced")
	}
	idx, err := r.Catalog.VMIndex(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("plan backup of %s: %w", vm, err)
	}
	var latest *catalog.CheckpointEntry
	for _, c := range idx.Latest() {
		if opts.HypervisorCheckpoints == nil || contains(opts.HypervisorCheckpoints, c.ID) {
			latest = c
			break
		}
	}
	if latest == nil {
		if len(idx.Latest()) == 0 {
			return full("no complete checkpoint in the store")
		}
		return full("the hypervisor has none of the stored checkpoints")
	}
	chain, err := idx.Chain(latest.ID)
	if err != nil {
		return full(err.Error())
	}
	if opts.MaxChainLength > 0 && len(chain) >= opts.MaxChainLength {
		return full(fmt.Sprintf("chain of %s has %d layers, the maximum is %d", latest.ID, len(chain), opts.MaxChainLength))
	}
	if err := r.VerifyChain(ctx, chain, opts.VerifyContent); err != nil {
		var oe *ObjectError
		if errors.As(err, &oe) {
			return full(err.Error())
		}
		return nil, fmt.Errorf("plan backup of %s: %w", vm, err)
	}
	return &Plan{Type: catalog.Incremental, Parent: latest.ID, Chain: chain}, nil
}

// VerifyChain checks every object of chain against the index: present,
// of the recorded size and ETag, and with content true to read the recorded
// digest. A mismatch is an *ObjectError.
func (r *Repository) VerifyChain(ctx context.Context, chain []catalog.CheckpointEntry, content bool) error {
	for _, c := range chain {
		for _, f := range c.Files {
			key := f.ObjectPath
			if content {
				if err := r.hashObject(ctx, key, f.Size, f.SHA256); err != nil {
					return err
				}
				continue
			}
			info, err := r.Store.Stat(ctx, key)
			if errors.Is(err, objectstore.ErrNotFound) {
				return &ObjectError{Object: key, Reason: fmt.Sprintf("missing from the bucket (checkpoint %s, disk %s)", c.ID, f.DiskName)}
			}
			if err != nil {
				return fmt.Errorf("verify %s: %w", key, err)
			}
			if info.Size != f.Size {
				return &ObjectError{Object: key, Reason: fmt.Sprintf("has %d bytes, the index records %d: the object was altered", info.Size, f.Size)}
			}
			if f.ETag != "" && info.ETag != f.ETag {
				return &ObjectError{Object: key, Reason: fmt.Sprintf("has ETag %s, the index records %s: the object was replaced", info.ETag, f.ETag)}
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// CheckpointSpec describes the checkpoint an upload adds.
type CheckpointSpec struct {
	// ID is the hypervisor's checkpoint name.
	ID     string
	Type   catalog.CheckpointType
	Parent string
	// Backup is the backup (Velero's, or the CLI's name) this upload is for.
	Backup   string
	VMBackup string
	PVCs     []string
	PVCSizes map[string]string
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

func (s CheckpointSpec) validate() error {
	if !namePattern.MatchString(s.ID) {
		return fmt.Errorf("checkpoint id %q: want letters, digits, '.', '_' or '-'", s.ID)
	}
	if !namePattern.MatchString(s.Backup) {
		return fmt.Errorf("backup name %q: want letters, digits, '.', '_' or '-'", s.Backup)
	}
	switch s.Type {
	case catalog.Full:
		if s.Parent != "" {
			return fmt.Errorf("full checkpoint %s names parent %s", s.ID, s.Parent)
		}
	case catalog.Incremental:
		if s.Parent == "" {
			return fmt.Errorf("incremental checkpoint %s has no parent", s.ID)
		}
	default:
		return fmt.Errorf("checkpoint %s: unknown type %q", s.ID, s.Type)
	}
	return nil
}

func validateVM(vm catalog.VM) error {
	if !namePattern.MatchString(vm.Namespace) || !namePattern.MatchString(vm.Name) {
		return fmt.Errorf("VM %q: namespace and name must be Kubernetes names", vm)
	}
	return nil
}

// Upload adds one checkpoint of one VM to the store.
type Upload struct {
	repo        *Repository
	vm          catalog.VM
	spec        CheckpointSpec
	files       []catalog.FileEntry
	attachments map[string]string
}

// ErrCheckpointExists is returned by Begin for a checkpoint already
// complete in the index.
var ErrCheckpointExists = errors.New("checkpoint already complete")

// Begin records a pending checkpoint in the VM's index before any data is
// uploaded, so that garbage collection leaves its objects (and its
// parent's) alone while the upload runs, and can tell them from debris once
// the upload is older than the grace period. Beginning a checkpoint that
// is still pending takes it over (a retried upload).
func (r *Repository) Begin(ctx context.Context, vm catalog.VM, spec CheckpointSpec) (*Upload, error) {
	if err := validateVM(vm); err != nil {
		return nil, err
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	_, err := r.Catalog.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
		if spec.Type == catalog.Incremental {
			p := idx.Checkpoint(spec.Parent)
			if p == nil || !p.IsComplete() {
				return fmt.Errorf("parent checkpoint %s of %s is not complete in the index of %s", spec.Parent, spec.ID, vm)
			}
		}
		entry := catalog.CheckpointEntry{
			ID: spec.ID, Type: spec.Type, Parent: spec.Parent, Timestamp: r.now(),
			VMBackup: spec.VMBackup, PVCs: spec.PVCs, PVCSizes: spec.PVCSizes,
			ReferencedBy: []string{}, Files: []catalog.FileEntry{},
			State: catalog.Pending, Backup: spec.Backup,
		}
		if c := idx.Checkpoint(spec.ID); c != nil {
			if c.IsComplete() {
				return fmt.Errorf("checkpoint %s of %s: %w", spec.ID, vm, ErrCheckpointExists)
			}
			*c = entry
			return nil
		}
		idx.Checkpoints = append(idx.Checkpoints, entry)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("begin checkpoint %s of %s: %w", spec.ID, vm, err)
	}
	return &Upload{repo: r, vm: vm, spec: spec, attachments: map[string]string{}}, nil
}

// PutDisk inspects a checkpoint's qcow2 file of disk and streams it to the
// store. A full checkpoint's file must have no backing file and an
// incremental's must have one: a hypervisor that silently took a full
// backup instead is caught here. No file may use an external data file.
func (u *Upload) PutDisk(ctx context.Context, disk, file string, progress Progress) (catalog.FileEntry, error) {
	if !namePattern.MatchString(disk) {
		return catalog.FileEntry{}, fmt.Errorf("disk name %q: want letters, digits, '.', '_' or '-'", disk)
	}
	info, err := u.repo.Qemu.Info(ctx, file, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
	if err != nil {
		return catalog.FileEntry{}, fmt.Errorf("disk %s of checkpoint %s: %w", disk, u.spec.ID, err)
	}
	if err := checkLayer(info, u.spec.Type); err != nil {
		return catalog.FileEntry{}, fmt.Errorf("disk %s of checkpoint %s (%s): %w", disk, u.spec.ID, file, err)
	}
	rel := catalog.DiskPath(u.vm, u.spec.ID, u.spec.Backup, disk)
	up, err := u.repo.uploadFile(ctx, rel, file, progress)
	if err != nil {
		return catalog.FileEntry{}, fmt.Errorf("disk %s of checkpoint %s: %w", disk, u.spec.ID, err)
	}
	entry := catalog.FileEntry{
		Filename: path.Base(rel), DiskName: disk, Size: up.Size, ObjectPath: rel,
		SHA256: up.SHA256, ETag: up.ETag, VirtualSize: info.VirtualSize,
	}
	for i := range u.files {
		if u.files[i].DiskName == disk {
			u.files[i] = entry
			return entry, nil
		}
	}
	u.files = append(u.files, entry)
	return entry, nil
}

// checkLayer checks what a layer of a chain must be.
func checkLayer(info *qcow2.Info, t catalog.CheckpointType) error {
	if info.Format != qcow2.FormatQcow2 {
		return fmt.Errorf("format is %q, want qcow2", info.Format)
	}
	if info.FormatSpecific.Data.DataFile != "" {
		return fmt.Errorf("uses external data file %s", info.FormatSpecific.Data.DataFile)
	}
	return checkBacking(info.BackingFilename, t)
}

// checkBacking refuses a full layer with a backing file and an incremental
// one without.
func checkBacking(backing string, t catalog.CheckpointType) error {
	switch t {
	case catalog.Full:
		if backing != "" {
			return fmt.Errorf("full layer has backing file %s", backing)
		}
	case catalog.Incremental:
		if backing == "" {
			return fmt.Errorf("incremental layer has no backing file (the hypervisor took a full backup?)")
		}
	}
	return nil
}

// Well-known attachment names of the published design.
const (
	AttachmentVMBackup        = "vmb.json"
	AttachmentVMBackupTracker = "vmbt.json"
)

// PutAttachment stores a small side file of the checkpoint (such as the
// VirtualMachineBackup as vmb.json) and returns its path relative to the
// datamover root.
func (u *Upload) PutAttachment(ctx context.Context, name string, data []byte) (string, error) {
	if !namePattern.MatchString(name) {
		return "", fmt.Errorf("attachment name %q: want letters, digits, '.', '_' or '-'", name)
	}
	rel := catalog.AttachmentPath(u.vm, u.spec.ID, name)
	if _, err := u.repo.Store.Put(ctx, rel, bytesReader(data), int64(len(data)),
		objectstore.PutOptions{ContentType: "application/json"}); err != nil {
		return "", fmt.Errorf("attachment %s of checkpoint %s: %w", name, u.spec.ID, err)
	}
	u.attachments[name] = rel
	return rel, nil
}

// Commit records the uploaded files in the VM's index, marks the
// checkpoint complete and referenced by the backup along its whole chain,
// writes the VM's manifest of the backup and adds the VM to the backup's
// index — each a conditional write, so VMs of one backup and backups of one
// VM finishing together keep each other's changes.
func (u *Upload) Commit(ctx context.Context) (*catalog.CheckpointEntry, error) {
	if len(u.files) == 0 {
		return nil, fmt.Errorf("commit checkpoint %s of %s: no disk uploaded", u.spec.ID, u.vm)
	}
	var committed catalog.CheckpointEntry
	var chainIDs []string
	_, err := u.repo.Catalog.UpdateVMIndex(ctx, u.vm, func(idx *catalog.VMIndex) error {
		c := idx.Checkpoint(u.spec.ID)
		if c == nil {
			return fmt.Errorf("checkpoint %s is no longer in the index (collected as stale?)", u.spec.ID)
		}
		if c.IsComplete() {
			return fmt.Errorf("checkpoint %s: %w", u.spec.ID, ErrCheckpointExists)
		}
		c.Files = append([]catalog.FileEntry(nil), u.files...)
		c.State = catalog.Complete
		c.Sequence = idx.NextSequence()
		c.VMBObjectPath = u.attachments[AttachmentVMBackup]
		c.VMBTObjectPath = u.attachments[AttachmentVMBackupTracker]
		chain, err := idx.Chain(u.spec.ID)
		if err != nil {
			return err
		}
		for _, link := range chain {
			idx.Checkpoint(link.ID).AddReference(u.spec.Backup)
		}
		committed = *idx.Checkpoint(u.spec.ID)
		chainIDs = catalog.IDs(chain)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("commit checkpoint %s of %s: %w", u.spec.ID, u.vm, err)
	}
	if err := u.repo.RecordBackup(ctx, u.spec.Backup, u.vm, chainIDs); err != nil {
		return nil, fmt.Errorf("commit checkpoint %s of %s: %w", u.spec.ID, u.vm, err)
	}
	return &committed, nil
}

// RecordBackup writes the manifests that let backup restore vm from chain
// (base first): manifests/<backup>/<ns>-<vm>.json and the VM's line in
// manifests/<backup>/index.json.
func (r *Repository) RecordBackup(ctx context.Context, backup string, vm catalog.VM, chain []string) error {
	rel, err := r.Catalog.PutVMManifest(ctx, catalog.VMBackupManifest{
		Namespace: vm.Namespace, Name: vm.Name, CheckpointChain: chain,
		BackupName: backup, Timestamp: r.now(),
	})
	if err != nil {
		return fmt.Errorf("record %s in backup %s: %w", vm, backup, err)
	}
	_, err = r.Catalog.AddVMToBackup(ctx, backup, catalog.BackupVM{
		Name: vm.Name, Namespace: vm.Namespace, CheckpointID: chain[len(chain)-1], ManifestPath: rel,
	})
	if err != nil {
		return fmt.Errorf("record %s in backup %s: %w", vm, backup, err)
	}
	return nil
}

// Abort removes a pending checkpoint and whatever it uploaded. It is best
// effort: what it cannot remove, garbage collection does after the grace
// period.
func (u *Upload) Abort(ctx context.Context) error {
	_, err := u.repo.Catalog.UpdateVMIndex(ctx, u.vm, func(idx *catalog.VMIndex) error {
		for i, c := range idx.Checkpoints {
			if c.ID == u.spec.ID && !c.IsComplete() {
				idx.Checkpoints = append(idx.Checkpoints[:i], idx.Checkpoints[i+1:]...)
				return nil
			}
		}
		return catalog.ErrUnchanged
	})
	if err != nil {
		return fmt.Errorf("abort checkpoint %s of %s: %w", u.spec.ID, u.vm, err)
	}
	return u.repo.deletePrefix(ctx, catalog.CheckpointDir(u.vm, u.spec.ID), nil)
}

// Spec is the checkpoint the upload adds.
func (u *Upload) Spec() CheckpointSpec { return u.spec }
