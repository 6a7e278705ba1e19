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

// Package catalog holds the JSON documents that describe backups in the
// object store — the per-VM checkpoint index, the per-backup manifests —
// where they live, how a chain of checkpoints is read out of them, and how
// they are updated without losing a concurrent writer's change.
//
// The layout and field names follow the published OADP KubeVirt datamover
// design; what this package adds is marked "extension" and is optional on
// read, so documents written by that design are read as schema version 0.
package catalog

import (
	"time"
)

// SchemaVersion is the version of the documents this package writes. A
// document with a higher version was written by a newer release and is
// refused rather than misread.
const SchemaVersion = 1

// CheckpointType says whether a checkpoint's files hold whole disks or only
// what changed since the parent.
type CheckpointType string

// Checkpoint types.
const (
	Full        CheckpointType = "full"
	Incremental CheckpointType = "incremental"
)

// CheckpointState is where an upload is (extension). Documents of schema
// version 0 have no state: their checkpoints are complete.
type CheckpointState string

// Checkpoint states.
const (
	// Pending marks a checkpoint whose files are being uploaded: it is no
	// parent for a new backup and no part of a restore; garbage collection
	// removes it once it is older than the grace period.
	Pending CheckpointState = "pending"
	// Complete marks a checkpoint whose files are all uploaded and recorded.
	Complete CheckpointState = "complete"
)

// VMIndex is checkpoints/<ns>/<vm>/index.json: every checkpoint of one VM.
type VMIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	VMName        string            `json:"vmName"`
	Namespace     string            `json:"namespace"`
	Checkpoints   []CheckpointEntry `json:"checkpoints"`
	LastUpdated   time.Time         `json:"lastUpdated"`
}

// CheckpointEntry is one checkpoint of a VM: the files of its disks and the
// backups that need it.
type CheckpointEntry struct {
	// ID is the hypervisor's checkpoint name, unique per VM.
	ID        string         `json:"id"`
	Type      CheckpointType `json:"type"`
	Parent    string         `json:"parent,omitempty"`
	Timestamp time.Time      `json:"timestamp"`
	// VMBackup is the VirtualMachineBackup (or other job) that produced it.
	VMBackup string      `json:"vmBackup,omitempty"`
	Files    []FileEntry `json:"files"`
	PVCs     []string    `json:"pvcs,omitempty"`
	// PVCSizes maps a PVC to its capacity (a resource.Quantity string).
	PVCSizes map[string]string `json:"pvcSizes,omitempty"`
	// ReferencedBy lists the backups whose restore needs this checkpoint:
	// the backup that made it and every backup whose chain passes through
	// it. A checkpoint no backup references is garbage.
	ReferencedBy   []string `json:"referencedBy"`
	VMBObjectPath  string   `json:"vmbObjectPath,omitempty"`
	VMBTObjectPath string   `json:"vmbtObjectPath,omitempty"`

	// State is the upload's progress (extension; empty means Complete).
	State CheckpointState `json:"state,omitempty"`
	// Sequence orders checkpoints by completion within the index
	// (extension): the highest complete one is the latest.
	Sequence int64 `json:"sequence,omitempty"`
	// Backup is the backup that created the checkpoint (extension).
	Backup string `json:"backup,omitempty"`
}

// FileEntry is one disk's qcow2 file of a checkpoint.
type FileEntry struct {
	Filename string `json:"filename"`
	DiskName string `json:"diskName"`
	Size     int64  `json:"size"`
	// ObjectPath is the object's key relative to the datamover root.
	ObjectPath string `json:"objectPath"`
	// SHA256 is the hex digest of the object's bytes (extension).
	SHA256 string `json:"sha256,omitempty"`
	// ETag is the store's tag for the object as uploaded (extension): a
	// cheap check that nobody replaced it.
	ETag string `json:"etag,omitempty"`
	// VirtualSize is the disk's guest-visible size (extension).
	VirtualSize int64 `json:"virtualSize,omitempty"`
}

// BackupManifest is manifests/<backup>/index.json: the VMs a backup holds.
type BackupManifest struct {
	SchemaVersion int        `json:"schemaVersion"`
	BackupName    string     `json:"backupName"`
	Timestamp     time.Time  `json:"timestamp"`
	VMs           []BackupVM `json:"vms"`
}

// BackupVM is one VM of a backup.
type BackupVM struct {
	Name         string `json:"name"`
	Namespace    string `json:"namespace"`
	CheckpointID string `json:"checkpointId"`
	// ManifestPath is the VMBackupManifest's key relative to the root.
	ManifestPath string `json:"manifestPath"`
}

// VMBackupManifest is manifests/<backup>/<ns>-<vm>.json: the chain of
// checkpoints, base first, that restores one VM of a backup.
type VMBackupManifest struct {
	SchemaVersion   int       `json:"schemaVersion"`
	Namespace       string    `json:"namespace"`
	Name            string    `json:"name"`
	CheckpointChain []string  `json:"checkpointChain"`
	BackupName      string    `json:"backupName"`
	Timestamp       time.Time `json:"timestamp"`
}

// IsComplete reports whether the checkpoint's upload finished.
func (c *CheckpointEntry) IsComplete() bool {
	return c.State == "" || c.State == Complete
}

// File returns the checkpoint's file of disk, or nil.
func (c *CheckpointEntry) File(disk string) *FileEntry {
	for i := range c.Files {
		if c.Files[i].DiskName == disk {
			return &c.Files[i]
		}
	}
	return nil
}

// IsReferencedBy reports whether backup needs the checkpoint.
func (c *CheckpointEntry) IsReferencedBy(backup string) bool {
	for _, b := range c.ReferencedBy {
		if b == backup {
			return true
		}
	}
	return false
}

// AddReference records that backup needs the checkpoint; it reports whether
// that changed anything.
func (c *CheckpointEntry) AddReference(backup string) bool {
	if c.IsReferencedBy(backup) {
		return false
	}
	c.ReferencedBy = append(c.ReferencedBy, backup)
	return true
}

// RemoveReference drops backup from the checkpoint's references; it reports
// whether that changed anything.
func (c *CheckpointEntry) RemoveReference(backup string) bool {
	out := c.ReferencedBy[:0]
	for _, b := range c.ReferencedBy {
		if b != backup {
			out = append(out, b)
		}
	}
	changed := len(out) != len(c.ReferencedBy)
	c.ReferencedBy = out
	return changed
}
