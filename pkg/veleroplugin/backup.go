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

package veleroplugin

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	biav2 "github.com/vmware-tanzu/velero/pkg/plugin/velero/backupitemaction/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// dataUploadResource is how Velero names a DataUpload among the items of
// a backup.
var dataUploadResource = schema.GroupResource{Group: velerov2.SchemeGroupVersion.Group, Resource: "datauploads"}

// BackupAction is the BackupItemAction (v2) on VirtualMachines. In a backup
// whose spec.datamover is "kubevirt", for a running VM with disks backed by
// claims, Execute creates a DataUpload in Velero's namespace that names the
// VM and returns its operation ID; Velero then polls Progress until the
// controller has completed, failed or canceled it, cancels it through Cancel
// when spec.itemOperationTimeout runs out, and backs the finished DataUpload
// up with the backup (a post-operation item). Any other VM, and every VM of
// another backup, is left to Velero and its other plugins.
type BackupAction struct {
	client client.Client
	log    logrus.FieldLogger
}

// NewBackupAction returns the action, which reads and writes the cluster
// through c.
func NewBackupAction(c client.Client, log logrus.FieldLogger) *BackupAction {
	return &BackupAction{client: c, log: log}
}

// Name is the name the action is registered under.
func (a *BackupAction) Name() string { return BackupActionName }

// AppliesTo selects VirtualMachines.
func (a *BackupAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{virtualMachines}}, nil
}

// Execute starts the backup of a VM selected for the data mover.
func (a *BackupAction) Execute(item runtime.Unstructured, backup *velerov1.Backup) (
	runtime.Unstructured, []velero.ResourceIdentifier, string, []velero.ResourceIdentifier, error,
) {
	if !runsDataMover(backup) {
		return item, nil, "", nil, nil
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.UnstructuredContent(), vm); err != nil {
		return nil, nil, "", nil, fmt.Errorf("read VirtualMachine: %w", err)
	}
	log := a.log.WithFields(logrus.Fields{"backup": backup.Namespace + "/" + backup.Name, "vm": vm.Namespace + "/" + vm.Name})
	disks := datamover.DiskClaims(vm)
	switch {
	case len(disks) == 0:
		log.Info("VirtualMachine has no disk backed by a claim: nothing for the kubevirt data mover")
		return item, nil, "", nil, nil
	case !takesVM(vm):
		status := string(vm.Status.PrintableStatus)
		if status == "" {
			status = "not running"
		}
		log.Warnf("VirtualMachine is %s: the kubevirt data mover backs up running VMs only; its disks are not in this backup unless another of Velero's methods takes them", status)
		return item, nil, "", nil, nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	opID := operationID(velerov1.AsyncOperationIDPrefixDataUpload, string(backup.UID), vmKey(vm))
	du, err := a.create(ctx, newDataUpload(backup, vm, disks[0].Name, opID))
	if err != nil {
		return nil, nil, "", nil, err
	}
	opID = du.Labels[velerov1.AsyncOperationIDLabel]
	log.WithField("operation", opID).Infof("DataUpload %s/%s created", du.Namespace, du.Name)

	// The item is changed in place, not through the typed VM: fields this
	// build of the KubeVirt API does not know stay in the backup.
	u := &unstructured.Unstructured{Object: item.UnstructuredContent()}
	annotations := u.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[velerov1.DataUploadNameAnnotation] = du.Namespace + "/" + du.Name
	u.SetAnnotations(annotations)
	post := []velero.ResourceIdentifier{{GroupResource: dataUploadResource, Namespace: du.Namespace, Name: du.Name}}
	return u, nil, opID, post, nil
}

// runsDataMover reports whether the actions take part in backup: it
// selects the kubevirt data mover and is not being finalized (Velero
// refuses operations started then; the items were handled when the backup
// ran).
func runsDataMover(backup *velerov1.Backup) bool {
	p := backup.Status.Phase
	return backup.Spec.DataMover == datamover.DataMover &&
		p != velerov1.BackupPhaseFinalizing && p != velerov1.BackupPhaseFinalizingPartiallyFailed
}

// takesVM reports whether the backup action backs vm up with the data
// mover, in a backup that runs it: a running VM with disks on claims.
func takesVM(vm *kubevirtv1.VirtualMachine) bool {
	return vm.Status.PrintableStatus == kubevirtv1.VirtualMachineStatusRunning && len(datamover.DiskClaims(vm)) > 0
}

// vmKey identifies a VM in an operation ID: its UID, else its name.
func vmKey(vm *kubevirtv1.VirtualMachine) string {
	if vm.UID != "" {
		return string(vm.UID)
	}
	return vm.Namespace + "." + vm.Name
}

// newDataUpload is the DataUpload of vm for backup, as the controller reads
// it (datamover.UploadTarget) and as Velero's CSI action labels its own.
func newDataUpload(backup *velerov1.Backup, vm *kubevirtv1.VirtualMachine, firstClaim, opID string) *velerov2.DataUpload {
	annotations := map[string]string{
		datamover.AnnotationVMName:      vm.Name,
		datamover.AnnotationVMNamespace: vm.Namespace,
		datamover.AnnotationBackupName:  backup.Name,
		datamover.AnnotationOperationID: opID,
	}
	if datamover.ForceFull(backup.Annotations) || datamover.ForceFull(vm.Annotations) {
		annotations[datamover.AnnotationForceFull] = "true"
	}
	if size := vm.Annotations[datamover.AnnotationBackupPVCSize]; size != "" {
		annotations[datamover.AnnotationBackupPVCSize] = size
	}
	timeout := backup.Spec.ItemOperationTimeout
	if timeout.Duration <= 0 {
		timeout = metav1.Duration{Duration: DefaultOperationTimeout}
	}
	return &velerov2.DataUpload{
		ObjectMeta: metav1.ObjectMeta{
			Name:      objectName(string(backup.UID)+"/"+vm.Namespace+"/"+vm.Name, backup.Name, vm.Name),
			Namespace: backup.Namespace,
			Labels: map[string]string{
				velerov1.BackupNameLabel:       CatalogBackupName(backup.Name),
				velerov1.BackupUIDLabel:        string(backup.UID),
				velerov1.AsyncOperationIDLabel: opID,
			},
			Annotations:     annotations,
			OwnerReferences: []metav1.OwnerReference{ownerReference("Backup", backup.Name, backup.UID)},
		},
		Spec: velerov2.DataUploadSpec{
			// CSI is the only snapshot type Velero's API knows; the data
			// mover, not the type, selects the controller (OADP does the
			// same). sourcePVC, required, names the VM's first disk.
			SnapshotType:          velerov2.SnapshotTypeCSI,
			SourcePVC:             firstClaim,
			DataMover:             datamover.DataMover,
			BackupStorageLocation: backup.Spec.StorageLocation,
			SourceNamespace:       vm.Namespace,
			OperationTimeout:      timeout,
		},
	}
}

// create creates du, or finds the one an earlier call for the same backup
// and VM created.
func (a *BackupAction) create(ctx context.Context, du *velerov2.DataUpload) (*velerov2.DataUpload, error) {
	err := withRetry(func() error { return a.client.Create(ctx, du) })
	if err == nil {
		return du, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create DataUpload %s/%s: %w", du.Namespace, du.Name, err)
	}
	found := &velerov2.DataUpload{}
	if err := withRetry(func() error { return a.client.Get(ctx, client.ObjectKeyFromObject(du), found) }); err != nil {
		return nil, fmt.Errorf("get DataUpload %s/%s: %w", du.Namespace, du.Name, err)
	}
	same := found.Spec.DataMover == datamover.DataMover &&
		found.Labels[velerov1.BackupUIDLabel] == du.Labels[velerov1.BackupUIDLabel] &&
		found.Labels[velerov1.AsyncOperationIDLabel] != "" &&
		found.Annotations[datamover.AnnotationVMName] == du.Annotations[datamover.AnnotationVMName] &&
		found.Annotations[datamover.AnnotationVMNamespace] == du.Annotations[datamover.AnnotationVMNamespace]
	if !same {
		return nil, fmt.Errorf("DataUpload %s/%s exists and is not this backup's of this VirtualMachine", du.Namespace, du.Name)
	}
	return found, nil
}

// Progress reports the DataUpload of the operation as Velero's CSI action
// reports its own: bytes, phase, and Completed (with Err on failure or
// cancellation) once it has ended. A failed read is retried at Velero's
// next poll rather than failing the operation.
func (a *BackupAction) Progress(operationID string, backup *velerov1.Backup) (velero.OperationProgress, error) {
	progress := velero.OperationProgress{}
	if operationID == "" {
		return progress, biav2.InvalidOperationIDError(operationID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	du, err := a.find(ctx, backup.Namespace, operationID)
	if err != nil {
		if isMissing(err) {
			return progress, err
		}
		a.log.WithError(err).Warnf("progress of operation %s: will ask again", operationID)
		progress.Description = "waiting: " + err.Error()
		return progress, nil
	}
	s := du.Status
	if s.Phase == "" || s.Phase == velerov2.DataUploadPhaseNew {
		progress.Description = string(velerov2.DataUploadPhaseNew)
		return progress, nil
	}
	progress.Description = phaseMessage(string(s.Phase), s.Message)
	progress.OperationUnits = "Bytes"
	progress.NCompleted, progress.NTotal = s.Progress.BytesDone, s.Progress.TotalBytes
	if s.StartTimestamp != nil {
		progress.Started = s.StartTimestamp.Time
	}
	if s.CompletionTimestamp != nil {
		progress.Updated = s.CompletionTimestamp.Time
	}
	switch s.Phase {
	case velerov2.DataUploadPhaseCompleted:
		progress.Completed = true
	case velerov2.DataUploadPhaseFailed:
		progress.Completed, progress.Err = true, fmt.Sprintf("DataUpload %s failed: %s", du.Name, s.Message)
	case velerov2.DataUploadPhaseCanceled:
		progress.Completed, progress.Err = true, fmt.Sprintf("DataUpload %s is canceled", du.Name)
	}
	return progress, nil
}

// Cancel asks the controller to cancel the operation's DataUpload
// (spec.cancel), as Velero's CSI action does. Velero calls it once and
// ignores its error, so a failed request is repeated a few times here.
func (a *BackupAction) Cancel(operationID string, backup *velerov1.Backup) error {
	if operationID == "" {
		return biav2.InvalidOperationIDError(operationID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	var du *velerov2.DataUpload
	err := withRetry(func() (err error) {
		du, err = a.find(ctx, backup.Namespace, operationID)
		return err
	})
	if isMissing(err) {
		return nil
	} else if err != nil {
		return err
	}
	switch du.Status.Phase {
	case velerov2.DataUploadPhaseCompleted, velerov2.DataUploadPhaseFailed, velerov2.DataUploadPhaseCanceled:
		return nil
	}
	if err := withRetry(func() error { return setCancel(ctx, a.client, du) }); err != nil {
		return fmt.Errorf("cancel DataUpload %s/%s: %w", du.Namespace, du.Name, err)
	}
	a.log.WithField("operation", operationID).Infof("DataUpload %s/%s canceled", du.Namespace, du.Name)
	return nil
}

// find reads the DataUpload of an operation.
func (a *BackupAction) find(ctx context.Context, namespace, operationID string) (*velerov2.DataUpload, error) {
	list := &velerov2.DataUploadList{}
	if err := a.client.List(ctx, list, client.InNamespace(namespace),
		client.MatchingLabels{velerov1.AsyncOperationIDLabel: operationID}); err != nil {
		return nil, fmt.Errorf("list DataUploads of operation %s: %w", operationID, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, &missingError{what: "DataUpload", operationID: operationID}
	case 1:
		return &list.Items[0], nil
	}
	return nil, fmt.Errorf("%d DataUploads of operation %s", len(list.Items), operationID)
}

// setCancel sets spec.cancel with a merge patch: no conflict with the
// controller's status updates.
func setCancel(ctx context.Context, c client.Client, obj client.Object) error {
	patch := client.RawPatch(typesMergePatch, []byte(`{"spec":{"cancel":true}}`))
	return c.Patch(ctx, obj, patch)
}
