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

package datamover

import (
	"context"
	"fmt"
	"slices"

	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
)

// The cluster-wide limits (Config.MaxVMBackups, Config.MaxUploads) hold
// back a DataUpload before the step that would take a slot: creating its
// VirtualMachineBackup (QEMU's work on the VM's node) or its upload pod
// (the transfer to the store). What runs is counted from what exists (the
// DataUploads' VirtualMachineBackups that have not ended, their upload
// pods that have not finished); the DataUploads waiting for a slot take
// the free ones oldest first, so none waits forever behind newer ones.

// slotFree says why j must wait for a slot, or "" when it may take one:
// running is how many slots are taken, waiting whether a live DataUpload
// waits for one.
func (r *DataUploadReconciler) slotFree(ctx context.Context, j *uploadJob, limit, running int, waiting func(*velerov2.DataUpload) bool, what, flag string) (string, error) {
	if limit <= 0 {
		return "", nil
	}
	list := &velerov2.DataUploadList{}
	if err := r.Client.List(ctx, list, client.InNamespace(j.du.Namespace)); err != nil {
		return "", fmt.Errorf("list DataUploads: %w", err)
	}
	ahead := 0
	for i := range list.Items {
		o := &list.Items[i]
		if o.Spec.DataMover == DataMover && o.UID != j.du.UID && !uploadDone(o.Status.Phase) && waiting(o) && olderUpload(o, j.du) {
			ahead++
		}
	}
	if running+ahead < limit {
		return "", nil
	}
	return fmt.Sprintf("waiting for a slot: %d %s run, the most %s=%d allows, and %d DataUploads wait ahead of this one",
		running, what, flag, limit, ahead), nil
}

// olderUpload orders DataUploads by creation, then name.
func olderUpload(a, b *velerov2.DataUpload) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// ownedBy lists the UIDs of the DataUploads that have an object in objs,
// and counts the objects live says still hold a slot.
func ownedBy[T any](objs []T, labelsOf func(*T) map[string]string, live func(*T) bool) (map[types.UID]bool, int) {
	owners, running := map[types.UID]bool{}, 0
	for i := range objs {
		owners[types.UID(labelsOf(&objs[i])[LabelOwnerUID])] = true
		if live(&objs[i]) {
			running++
		}
	}
	return owners, running
}

// backupSlot says why j must wait before creating its VirtualMachineBackup.
func (r *DataUploadReconciler) backupSlot(ctx context.Context, j *uploadJob) (string, error) {
	if r.Config.MaxVMBackups <= 0 {
		return "", nil
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kubevirtbackup.VMBackupGVK.GroupVersion().WithKind(kubevirtbackup.VMBackupGVK.Kind + "List"))
	if err := r.Client.List(ctx, list, client.MatchingLabels{LabelOwnerKind: KindDataUpload}); err != nil {
		return "", fmt.Errorf("list the DataUploads' VirtualMachineBackups: %w", err)
	}
	owners, running := ownedBy(list.Items, (*unstructured.Unstructured).GetLabels, func(u *unstructured.Unstructured) bool {
		vmb := &kubevirtbackup.VMBackup{}
		if err := kubevirtbackup.FromUnstructured(u, vmb); err != nil {
			return true
		}
		failed, _ := vmb.Failed()
		return !vmb.Succeeded() && !failed
	})
	return r.slotFree(ctx, j, r.Config.MaxVMBackups, running, func(o *velerov2.DataUpload) bool {
		return o.Status.Phase == velerov2.DataUploadPhaseAccepted && !owners[o.UID]
	}, "VM backups", "-concurrent-vm-backups")
}

// uploadSlot says why j must wait before creating its upload pod.
func (r *DataUploadReconciler) uploadSlot(ctx context.Context, j *uploadJob) (string, error) {
	if r.Config.MaxUploads <= 0 {
		return "", nil
	}
	list := &corev1.PodList{}
	if err := r.Client.List(ctx, list, client.InNamespace(j.du.Namespace), client.MatchingLabels{LabelOwnerKind: KindDataUpload}); err != nil {
		return "", fmt.Errorf("list the upload pods: %w", err)
	}
	owners, running := ownedBy(list.Items, (*corev1.Pod).GetLabels, func(p *corev1.Pod) bool {
		finished, _, _ := podOutcome(p)
		return !finished
	})
	return r.slotFree(ctx, j, r.Config.MaxUploads, running, func(o *velerov2.DataUpload) bool {
		return o.Status.Phase == velerov2.DataUploadPhasePrepared && !owners[o.UID]
	}, "uploads", "-concurrent-vm-datauploads")
}

// slotWaiters wakes the DataUploads that may wait for a slot when an object
// that takes one changes: the one that ended frees it.
func (r *DataUploadReconciler) slotWaiters(ctx context.Context, o client.Object) []reconcile.Request {
	if r.Config.MaxVMBackups <= 0 && r.Config.MaxUploads <= 0 || o.GetLabels()[LabelOwnerKind] != KindDataUpload {
		return nil
	}
	phases := []velerov2.DataUploadPhase{velerov2.DataUploadPhaseAccepted, velerov2.DataUploadPhasePrepared}
	return r.liveUploads(ctx, func(du *velerov2.DataUpload) bool {
		return du.Spec.DataMover == DataMover && slices.Contains(phases, du.Status.Phase)
	})
}
