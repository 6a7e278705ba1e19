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
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/label"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	riav2 "github.com/vmware-tanzu/velero/pkg/plugin/velero/restoreitemaction/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// RestoreAction is the RestoreItemAction (v2) on VirtualMachines. For a VM
// that BackupAction saved (its backed-up item names a DataUpload) in a
// backup of the "kubevirt" data mover, Execute creates one DataDownload per
// disk in Velero's namespace, each restoring the disk as that backup saved
// it into the claim of the same name in the VM's target namespace (the
// restore's namespace mapping applied), and returns one operation ID for
// them all. The VM itself is restored stopped (runStrategy Halted), its run
// strategy kept in annotations, so that it does not run on a disk being
// written. Restores that do not restore volumes (spec.restorePVs false)
// and VMs the action did not save are left as they are.
//
// The target claims are the ones Velero restores from the backup, unbound
// (Velero clears their spec.volumeName); the DataDownload controller waits
// for each to exist, restores the disk into a volume of its own and binds
// that volume to the claim. Each DataDownload names the VM as restored
// (datamover.AnnotationTargetVMName): the controller puts the run strategy
// back once the last of the VM's disks is restored.
type RestoreAction struct {
	client client.Client
	log    logrus.FieldLogger
}

// NewRestoreAction returns the action, which reads and writes the cluster
// through c.
func NewRestoreAction(c client.Client, log logrus.FieldLogger) *RestoreAction {
	return &RestoreAction{client: c, log: log}
}

// Name is the name the action is registered under.
func (a *RestoreAction) Name() string { return RestoreActionName }

// AppliesTo selects VirtualMachines.
func (a *RestoreAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{virtualMachines}}, nil
}

// Execute starts the restore of a VM's disks.
func (a *RestoreAction) Execute(in *velero.RestoreItemActionExecuteInput) (*velero.RestoreItemActionExecuteOutput, error) {
	unchanged := &velero.RestoreItemActionExecuteOutput{UpdatedItem: in.Item}
	fromBackup := in.ItemFromBackup
	if fromBackup == nil {
		fromBackup = in.Item
	}
	saved := &unstructured.Unstructured{Object: fromBackup.UnstructuredContent()}
	if saved.GetAnnotations()[velerov1.DataUploadNameAnnotation] == "" {
		return unchanged, nil
	}
	restore := in.Restore
	if r := restore.Spec.RestorePVs; r != nil && !*r {
		return unchanged, nil
	}
	vm := &kubevirtv1.VirtualMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(saved.Object, vm); err != nil {
		return nil, fmt.Errorf("read VirtualMachine: %w", err)
	}
	disks := datamover.DiskClaims(vm)
	if len(disks) == 0 {
		return unchanged, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	backup := &velerov1.Backup{}
	key := client.ObjectKey{Namespace: restore.Namespace, Name: restore.Spec.BackupName}
	if err := withRetry(func() error { return a.client.Get(ctx, key, backup) }); err != nil {
		return nil, fmt.Errorf("get backup %s of restore %s: %w", key.Name, restore.Name, err)
	}
	if backup.Spec.DataMover != datamover.DataMover {
		return unchanged, nil
	}

	target := vm.Namespace
	if ns, ok := restore.Spec.NamespaceMapping[vm.Namespace]; ok {
		target = ns
	}
	log := a.log.WithFields(logrus.Fields{"restore": restore.Namespace + "/" + restore.Name,
		"vm": vm.Namespace + "/" + vm.Name, "target": target})
	opID := operationID(velerov1.AsyncOperationIDPrefixDataDownload, string(restore.UID), vmKey(vm))
	snapshotID := datamover.SnapshotID(CatalogBackupName(backup.Name), vm.Namespace, vm.Name)
	restored := &unstructured.Unstructured{Object: in.Item.UnstructuredContent()}
	restored = restored.DeepCopy()
	for _, d := range disks {
		dd := newDataDownload(restore, backup, vm, d.Name, target, restored.GetName(), snapshotID, opID)
		if err := a.create(ctx, dd); err != nil {
			return nil, err
		}
		log.WithField("operation", opID).Infof("DataDownload %s/%s restores disk %s into claim %s/%s", dd.Namespace, dd.Name, d.Name, target, d.Name)
	}

	if err := haltVM(restored); err != nil {
		return nil, err
	}
	return &velero.RestoreItemActionExecuteOutput{UpdatedItem: restored, OperationID: opID}, nil
}

// newDataDownload restores one disk of vm into claim of namespace target,
// for the VM restored as targetVM, as Velero's CSI action labels its own
// DataDownloads.
func newDataDownload(restore *velerov1.Restore, backup *velerov1.Backup, vm *kubevirtv1.VirtualMachine, claim, target, targetVM, snapshotID, opID string) *velerov2.DataDownload {
	timeout := restore.Spec.ItemOperationTimeout
	if timeout.Duration <= 0 {
		timeout = metav1.Duration{Duration: DefaultOperationTimeout}
	}
	return &velerov2.DataDownload{
		ObjectMeta: metav1.ObjectMeta{
			Name:      objectName(string(restore.UID)+"/"+vm.Namespace+"/"+vm.Name+"/"+claim, restore.Name, vm.Name),
			Namespace: restore.Namespace,
			Labels: map[string]string{
				velerov1.RestoreNameLabel:      label.GetValidName(restore.Name),
				velerov1.RestoreUIDLabel:       string(restore.UID),
				velerov1.AsyncOperationIDLabel: opID,
			},
			Annotations: map[string]string{
				datamover.AnnotationVMName:       vm.Name,
				datamover.AnnotationVMNamespace:  vm.Namespace,
				datamover.AnnotationOperationID:  opID,
				datamover.AnnotationTargetVMName: targetVM,
			},
			OwnerReferences: []metav1.OwnerReference{ownerReference("Restore", restore.Name, restore.UID)},
		},
		Spec: velerov2.DataDownloadSpec{
			TargetVolume:          velerov2.TargetVolumeSpec{PVC: claim, Namespace: target},
			BackupStorageLocation: backup.Spec.StorageLocation,
			DataMover:             datamover.DataMover,
			SnapshotID:            snapshotID,
			SourceNamespace:       vm.Namespace,
			DataMoverConfig:       map[string]string{datamover.ConfigDisk: claim},
			OperationTimeout:      timeout,
		},
	}
}

// create creates dd, or accepts the one an earlier call created.
func (a *RestoreAction) create(ctx context.Context, dd *velerov2.DataDownload) error {
	err := withRetry(func() error { return a.client.Create(ctx, dd) })
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create DataDownload %s/%s: %w", dd.Namespace, dd.Name, err)
	}
	found := &velerov2.DataDownload{}
	if err := withRetry(func() error { return a.client.Get(ctx, client.ObjectKeyFromObject(dd), found) }); err != nil {
		return fmt.Errorf("get DataDownload %s/%s: %w", dd.Namespace, dd.Name, err)
	}
	if found.Labels[velerov1.AsyncOperationIDLabel] != dd.Labels[velerov1.AsyncOperationIDLabel] ||
		found.Spec.TargetVolume != dd.Spec.TargetVolume || found.Spec.SnapshotID != dd.Spec.SnapshotID {
		return fmt.Errorf("DataDownload %s/%s exists and is not this restore's of this disk", dd.Namespace, dd.Name)
	}
	return nil
}

// haltVM makes a restored VM stopped, recording the run strategy it had
// (datamover.AnnotationOriginalRunStrategy and its source) unless it was
// stopped already, and drops the annotation naming the backup's
// DataUpload.
func haltVM(u *unstructured.Unstructured) error {
	annotations := u.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, velerov1.DataUploadNameAnnotation)
	strategy, hasStrategy, err := unstructured.NestedString(u.Object, "spec", "runStrategy")
	if err != nil {
		return fmt.Errorf("VirtualMachine %s/%s: spec.runStrategy: %w", u.GetNamespace(), u.GetName(), err)
	}
	running, hasRunning, err := unstructured.NestedBool(u.Object, "spec", "running")
	if err != nil {
		return fmt.Errorf("VirtualMachine %s/%s: spec.running: %w", u.GetNamespace(), u.GetName(), err)
	}
	source := "runStrategy"
	switch {
	case hasStrategy:
	case hasRunning:
		source, strategy = "running", string(kubevirtv1.RunStrategyHalted)
		if running {
			strategy = string(kubevirtv1.RunStrategyAlways)
		}
	default:
		strategy = string(kubevirtv1.RunStrategyHalted)
	}
	if strategy != string(kubevirtv1.RunStrategyHalted) {
		if _, kept := annotations[datamover.AnnotationOriginalRunStrategy]; !kept {
			annotations[datamover.AnnotationOriginalRunStrategy] = strategy
			annotations[datamover.AnnotationOriginalRunStrategySource] = source
		}
		unstructured.RemoveNestedField(u.Object, "spec", "running")
		if err := unstructured.SetNestedField(u.Object, string(kubevirtv1.RunStrategyHalted), "spec", "runStrategy"); err != nil {
			return fmt.Errorf("VirtualMachine %s/%s: stop it: %w", u.GetNamespace(), u.GetName(), err)
		}
	}
	u.SetAnnotations(annotations)
	return nil
}

// Progress reports the operation's DataDownloads together: bytes summed,
// Completed once every one has ended, with Err naming those that failed or
// were canceled. A failed read is retried at Velero's next poll.
func (a *RestoreAction) Progress(operationID string, restore *velerov1.Restore) (velero.OperationProgress, error) {
	progress := velero.OperationProgress{}
	if operationID == "" {
		return progress, riav2.InvalidOperationIDError(operationID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	dds, err := a.find(ctx, restore.Namespace, operationID)
	if err != nil {
		if isMissing(err) {
			return progress, err
		}
		a.log.WithError(err).Warnf("progress of operation %s: will ask again", operationID)
		progress.Description = "waiting: " + err.Error()
		return progress, nil
	}
	progress.OperationUnits = "Bytes"
	var completed int
	var failures, live []string
	for i := range dds {
		dd := &dds[i]
		s := dd.Status
		progress.NCompleted += s.Progress.BytesDone
		progress.NTotal += s.Progress.TotalBytes
		if t := s.StartTimestamp; t != nil && (progress.Started.IsZero() || t.Time.Before(progress.Started)) {
			progress.Started = t.Time
		}
		if t := s.CompletionTimestamp; t != nil && t.After(progress.Updated) {
			progress.Updated = t.Time
		}
		phase := string(s.Phase)
		if phase == "" {
			phase = string(velerov2.DataDownloadPhaseNew)
		}
		switch s.Phase {
		case velerov2.DataDownloadPhaseCompleted:
			completed++
		case velerov2.DataDownloadPhaseFailed:
			failures = append(failures, fmt.Sprintf("DataDownload %s failed: %s", dd.Name, s.Message))
		case velerov2.DataDownloadPhaseCanceled:
			failures = append(failures, fmt.Sprintf("DataDownload %s is canceled", dd.Name))
		default:
			live = append(live, dd.Name+" "+phaseMessage(phase, s.Message))
		}
	}
	progress.Description = fmt.Sprintf("%d of %d DataDownloads completed", completed, len(dds))
	if len(live) > 0 {
		progress.Description += "; " + strings.Join(live, "; ")
	}
	if len(live) == 0 {
		progress.Completed = true
		progress.Err = strings.Join(failures, "; ")
	}
	return progress, nil
}

// Cancel asks the controller to cancel every live DataDownload of the
// operation. Velero calls it once and ignores its error, so failed
// requests are repeated a few times here.
func (a *RestoreAction) Cancel(operationID string, restore *velerov1.Restore) error {
	if operationID == "" {
		return riav2.InvalidOperationIDError(operationID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	var dds []velerov2.DataDownload
	err := withRetry(func() (err error) {
		dds, err = a.find(ctx, restore.Namespace, operationID)
		return err
	})
	if isMissing(err) {
		return nil
	} else if err != nil {
		return err
	}
	var failed []string
	for i := range dds {
		dd := &dds[i]
		switch dd.Status.Phase {
		case velerov2.DataDownloadPhaseCompleted, velerov2.DataDownloadPhaseFailed, velerov2.DataDownloadPhaseCanceled:
			continue
		}
		if err := withRetry(func() error { return setCancel(ctx, a.client, dd) }); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", dd.Name, err))
			continue
		}
		a.log.WithField("operation", operationID).Infof("DataDownload %s/%s canceled", dd.Namespace, dd.Name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("cancel DataDownloads of operation %s: %s", operationID, strings.Join(failed, "; "))
	}
	return nil
}

// AreAdditionalItemsReady is true: the action returns no additional items.
func (a *RestoreAction) AreAdditionalItemsReady([]velero.ResourceIdentifier, *velerov1.Restore) (bool, error) {
	return true, nil
}

// find reads the DataDownloads of an operation, by name.
func (a *RestoreAction) find(ctx context.Context, namespace, operationID string) ([]velerov2.DataDownload, error) {
	list := &velerov2.DataDownloadList{}
	if err := a.client.List(ctx, list, client.InNamespace(namespace),
		client.MatchingLabels{velerov1.AsyncOperationIDLabel: operationID}); err != nil {
		return nil, fmt.Errorf("list DataDownloads of operation %s: %w", operationID, err)
	}
	if len(list.Items) == 0 {
		return nil, &missingError{what: "DataDownload", operationID: operationID}
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}
