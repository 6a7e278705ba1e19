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

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AnnotationTargetVMName on a DataDownload names the VirtualMachine whose
// disk it restores, as restored: in the target claim's namespace, under
// the name the restore gives it (the snapshot ID names the VM the backup
// saved). The restore item action sets it.
const AnnotationTargetVMName = "kubevirt-datamover.io/target-vm-name"

// siblings wakes the other DataDownloads of a restore operation (Velero's
// velero.io/async-operation-id label: one per disk of a VM) when one
// changes, so that the last to complete sees the others completed.
func (r *DataDownloadReconciler) siblings(ctx context.Context, o client.Object) []reconcile.Request {
	dd, ok := o.(*velerov2.DataDownload)
	if !ok || dd.Spec.DataMover != DataMover || dd.Labels[velerov1.AsyncOperationIDLabel] == "" {
		return nil
	}
	list, err := r.operationDownloads(ctx, dd)
	if err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, s := range list {
		if s.Name != dd.Name {
			reqs = append(reqs, reconcile.Request{NamespacedName: nn(s.Namespace, s.Name)})
		}
	}
	return reqs
}

// operationDownloads lists the DataDownloads of dd's restore operation,
// dd among them.
func (r *DataDownloadReconciler) operationDownloads(ctx context.Context, dd *velerov2.DataDownload) ([]velerov2.DataDownload, error) {
	id := dd.Labels[velerov1.AsyncOperationIDLabel]
	if id == "" {
		return []velerov2.DataDownload{*dd}, nil
	}
	list := &velerov2.DataDownloadList{}
	if err := r.Client.List(ctx, list, client.InNamespace(dd.Namespace), client.MatchingLabels{velerov1.AsyncOperationIDLabel: id}); err != nil {
		return nil, fmt.Errorf("list DataDownloads of operation %s: %w", id, err)
	}
	return list.Items, nil
}

// resumeVM gives the restored VM back the run strategy the restore item
// action stopped it from (AnnotationOriginalRunStrategy) once every
// DataDownload of the operation has completed: the DataDownload that
// completes last restarts the VM, on disks that are all restored. A VM
// whose restore failed or was canceled stays stopped, its original run
// strategy kept in the annotation for its owner to decide.
func (r *DataDownloadReconciler) resumeVM(ctx context.Context, dd *velerov2.DataDownload) error {
	name := dd.Annotations[AnnotationTargetVMName]
	if name == "" || dd.Status.Phase != velerov2.DataDownloadPhaseCompleted {
		return nil
	}
	all, err := r.operationDownloads(ctx, dd)
	if err != nil {
		return err
	}
	for _, s := range all {
		if s.Name != dd.Name && s.Status.Phase != velerov2.DataDownloadPhaseCompleted {
			return nil
		}
	}
	key := client.ObjectKey{Namespace: dd.Spec.TargetVolume.Namespace, Name: name}
	if key.Namespace == "" {
		key.Namespace = dd.Spec.SourceNamespace
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Reader.Get(ctx, key, vm); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("get VirtualMachine %s: %w", key, err)
	}
	strategy, ok := vm.Annotations[AnnotationOriginalRunStrategy]
	if !ok {
		return nil
	}
	patch := client.MergeFromWithOptions(vm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	source := vm.Annotations[AnnotationOriginalRunStrategySource]
	delete(vm.Annotations, AnnotationOriginalRunStrategy)
	delete(vm.Annotations, AnnotationOriginalRunStrategySource)
	if source == "running" {
		vm.Spec.RunStrategy = nil
		vm.Spec.Running = ptr.To(strategy == string(kubevirtv1.RunStrategyAlways))
	} else {
		vm.Spec.Running = nil
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.VirtualMachineRunStrategy(strategy))
	}
	if err := r.Client.Patch(ctx, vm, patch); err != nil {
		return fmt.Errorf("restore the run strategy of VirtualMachine %s: %w", key, err)
	}
	r.Recorder.Eventf(dd, corev1.EventTypeNormal, "VMResumed",
		"restored run strategy %s of VirtualMachine %s: its %d disks are restored", strategy, key, len(all))
	return nil
}
