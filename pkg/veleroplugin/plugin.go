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

// Package veleroplugin holds the Velero plugin actions of the kubevirt data
// mover, which run in Velero's server through its plugin framework:
//
//   - BackupAction, a BackupItemAction (v2) on VirtualMachines: in a backup
//     whose spec.datamover is "kubevirt" it creates the DataUpload the
//     controller of package datamover serves, and reports it to Velero as
//     an asynchronous operation.
//   - RestoreAction, a RestoreItemAction (v2) on VirtualMachines: for a VM
//     the backup action saved, it creates a DataDownload per disk, restores
//     the VM stopped, and reports the downloads as one operation.
//   - ClaimBackupAction and ClaimRestoreAction, a BackupItemAction and a
//     RestoreItemAction (v2) on PersistentVolumeClaims and
//     PersistentVolumes: they prepare the claims of the VMs' disks for
//     their DataDownloads as Velero's CSI PVC restore action prepares the
//     claims of its own data mover (unbound, selecting Velero's
//     velero.io/dynamic-pv-restore label) and keep their volumes out of
//     the restore.
//   - OwnedRestoreAction, a RestoreItemAction (v2) on Pods and
//     VirtualMachineInstances: it keeps a VM's VMI and KubeVirt's pods of
//     it out of a restore; KubeVirt makes them again for the restored VM.
//   - DeleteAction, a DeleteItemAction on DataUploads: when Velero deletes a
//     backup, it removes the backup from the location's catalog and lets
//     garbage collection reclaim what no other backup needs — Velero's own
//     delete action ignores data movers that are not built in.
//
// Names follow Velero's own CSI actions (labels, operation IDs, owner
// references) and OADP's kubevirt data mover where it has one.
package veleroplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/label"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	biav2 "github.com/vmware-tanzu/velero/pkg/plugin/velero/backupitemaction/v2"
	riav2 "github.com/vmware-tanzu/velero/pkg/plugin/velero/restoreitemaction/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// The names the actions are registered under.
const (
	BackupActionName  = "kubevirt-datamover.io/vm-backup"
	RestoreActionName = "kubevirt-datamover.io/vm-restore"
	DeleteActionName  = "kubevirt-datamover.io/dataupload-delete"

	ClaimBackupActionName  = "kubevirt-datamover.io/pvc-backup"
	ClaimRestoreActionName = "kubevirt-datamover.io/pvc-restore"

	OwnedRestoreActionName = "kubevirt-datamover.io/vm-owned-restore"
)

// Resources the actions apply to, as Velero's resource selectors name them.
const (
	virtualMachines         = "virtualmachines.kubevirt.io"
	virtualMachineInstances = "virtualmachineinstances.kubevirt.io"
	dataUploads             = "datauploads.velero.io"
)

// DefaultOperationTimeout bounds a DataUpload or DataDownload whose backup
// or restore sets no spec.itemOperationTimeout: Velero's own default.
const DefaultOperationTimeout = 4 * time.Hour

// apiTimeout bounds one call of Velero's into an action.
const apiTimeout = 2 * time.Minute

// CatalogBackupName is the name a Velero backup has in the datamover's
// catalog: its velero.io/backup-name label, which the controller reads
// (names longer than a label value are shortened with a digest, as Velero
// does).
func CatalogBackupName(backupName string) string { return label.GetValidName(backupName) }

// objectName derives the name of an object the actions create: prefix-readable
// parts and a digest of key, at most 253 characters (a DNS subdomain), the
// same for the same key, so that a repeated call finds what an earlier one
// created.
func objectName(key string, parts ...string) string {
	sum := sha256.Sum256([]byte(key))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	name := strings.Join(parts, "-")
	if limit := 253 - len(suffix); len(name) > limit {
		name = strings.TrimRight(name[:limit], "-.")
	}
	return name + suffix
}

// operationID is Velero's form of an asynchronous operation's ID: a prefix
// ("du-", "dd-"), the backup's or restore's UID and the item's, shortened
// to a label value.
func operationID(prefix velerov1.AsyncOperationIDPrefix, owner, item string) string {
	return label.GetValidName(string(prefix) + owner + "." + item)
}

// ownerReference makes a DataUpload or DataDownload the Backup's or the
// Restore's, as Velero's own are: deleting the one deletes the other.
func ownerReference(kind, name string, uid types.UID) metav1.OwnerReference {
	controller := true
	return metav1.OwnerReference{APIVersion: velerov1.SchemeGroupVersion.String(), Kind: kind,
		Name: name, UID: uid, Controller: &controller}
}

// transient reports whether a failed request to the API server is worth
// repeating: not when what it names is gone or already there, or the
// server refused it as invalid or forbidden.
func transient(err error) bool {
	return !isMissing(err) && !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err) &&
		!apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) &&
		!apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && !errors.Is(err, context.Canceled)
}

// missingError says that an operation has no DataUpload or DataDownload:
// it never had one, or it was deleted.
type missingError struct{ what, operationID string }

func (e *missingError) Error() string {
	return fmt.Sprintf("no %s of operation %s", e.what, e.operationID)
}

func isMissing(err error) bool {
	var m *missingError
	return errors.As(err, &m)
}

// typesMergePatch is the patch type of setCancel.
const typesMergePatch = types.MergePatchType

// backoff is how often a call is tried before its failure is Velero's.
var backoff = wait.Backoff{Steps: 5, Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1}

// withRetry runs fn until it succeeds, fails for good or runs out of tries.
func withRetry(fn func() error) error {
	return retry.OnError(backoff, transient, fn)
}

// withoutOperations completes a RestoreItemAction (v2) that starts no
// asynchronous operation and returns no additional items.
type withoutOperations struct{}

// Progress has no operation to report.
func (withoutOperations) Progress(operationID string, _ *velerov1.Restore) (velero.OperationProgress, error) {
	return velero.OperationProgress{}, riav2.InvalidOperationIDError(operationID)
}

// Cancel has no operation to cancel.
func (withoutOperations) Cancel(string, *velerov1.Restore) error { return nil }

// AreAdditionalItemsReady is true: there are no additional items.
func (withoutOperations) AreAdditionalItemsReady([]velero.ResourceIdentifier, *velerov1.Restore) (bool, error) {
	return true, nil
}

// The actions are what Velero's plugin framework serves them as.
var (
	_ biav2.BackupItemAction  = (*BackupAction)(nil)
	_ biav2.BackupItemAction  = (*ClaimBackupAction)(nil)
	_ riav2.RestoreItemAction = (*RestoreAction)(nil)
	_ riav2.RestoreItemAction = (*ClaimRestoreAction)(nil)
	_ riav2.RestoreItemAction = (*OwnedRestoreAction)(nil)
	_ velero.DeleteItemAction = (*DeleteAction)(nil)
)

// phaseMessage is a phase and, when there is one, its message.
func phaseMessage(phase, message string) string {
	if message == "" {
		return phase
	}
	return fmt.Sprintf("%s: %s", phase, message)
}
