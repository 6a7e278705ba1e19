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
	"strings"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/label"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	biav2 "github.com/vmware-tanzu/velero/pkg/plugin/velero/backupitemaction/v2"
	"github.com/vmware-tanzu/velero/pkg/util/kube"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// AnnotationDiskOf marks, in a backup, a claim that the backup action saves
// as a disk of a VM, and the volume bound to it: its value is the VM,
// "<namespace>/<name>". It exists only in backups; a restore drops it.
const AnnotationDiskOf = "kubevirt-datamover.io/disk-of"

// AnnotationStateOf marks, in a backup, KubeVirt's persistent state claim
// of a VM whose disks the backup action saves, and the volume bound to it:
// its value is the VM, "<namespace>/<name>". It exists only in backups.
const AnnotationStateOf = "kubevirt-datamover.io/state-of"

// stateClaimLabel is the label KubeVirt puts on a VM's persistent state
// claim, naming the VM (its backend storage: changed block tracking's
// bitmaps, a persistent vTPM, EFI variables).
const stateClaimLabel = "persistent-state-for"

// The resources ClaimBackupAction and ClaimRestoreAction apply to, and the
// kind of a volume among them.
const (
	claims      = "persistentvolumeclaims"
	volumes     = "persistentvolumes"
	volumeKind  = "PersistentVolume"
	randomChars = 5 // Velero's GenerateNameRandomLength
)

// ClaimBackupAction is the BackupItemAction (v2) on PersistentVolumeClaims
// and PersistentVolumes. In a backup of the "kubevirt" data mover it marks
// (AnnotationDiskOf) each claim that BackupAction saves as a VM's disk — a
// disk of a running VM of the claim's namespace — and the volume bound to
// it, so that ClaimRestoreAction prepares them as Velero's CSI PVC restore
// action prepares the claims of its own data mover. Velero backs claims
// and volumes up before VMs (pods, claims and volumes come first), so the
// action asks the VMs themselves, not the DataUploads the VMs' backups
// create later.
type ClaimBackupAction struct {
	client client.Client
	log    logrus.FieldLogger
}

// NewClaimBackupAction returns the action, which reads VMs through c.
func NewClaimBackupAction(c client.Client, log logrus.FieldLogger) *ClaimBackupAction {
	return &ClaimBackupAction{client: c, log: log}
}

// Name is the name the action is registered under.
func (a *ClaimBackupAction) Name() string { return ClaimBackupActionName }

// AppliesTo selects claims and volumes.
func (a *ClaimBackupAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{claims, volumes}}, nil
}

// Execute marks a claim or volume the data mover saves, and unmarks any
// other.
func (a *ClaimBackupAction) Execute(item runtime.Unstructured, backup *velerov1.Backup) (
	runtime.Unstructured, []velero.ResourceIdentifier, string, []velero.ResourceIdentifier, error,
) {
	if !runsDataMover(backup) {
		return item, nil, "", nil, nil
	}
	u := &unstructured.Unstructured{Object: item.UnstructuredContent()}
	namespace, claim := u.GetNamespace(), u.GetName()
	if u.GetKind() == volumeKind {
		namespace, _, _ = unstructured.NestedString(u.Object, "spec", "claimRef", "namespace")
		claim, _, _ = unstructured.NestedString(u.Object, "spec", "claimRef", "name")
	}
	var mark, vm string
	if namespace != "" && claim != "" {
		var err error
		if mark, vm, err = a.markOf(namespace, claim); err != nil {
			return nil, nil, "", nil, err
		}
	}
	annotations := u.GetAnnotations()
	for _, key := range []string{AnnotationDiskOf, AnnotationStateOf} {
		if _, marked := annotations[key]; marked && key != mark {
			delete(annotations, key)
		}
	}
	u.SetAnnotations(annotations)
	if mark == "" {
		return u, nil, "", nil, nil
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[mark] = vm
	u.SetAnnotations(annotations)
	log := a.log.WithFields(logrus.Fields{"backup": backup.Namespace + "/" + backup.Name, "vm": vm})
	if mark == AnnotationDiskOf {
		log.Infof("%s %s is a disk the kubevirt data mover backs up: marked for its restore", u.GetKind(), u.GetName())
	} else {
		log.Infof("%s %s is KubeVirt's persistent state of the VM: marked for its restore", u.GetKind(), u.GetName())
	}
	return u, nil, "", nil, nil
}

// markOf tells what claim namespace/name is to a VM whose disks the backup
// action saves: AnnotationDiskOf for one of its disks, AnnotationStateOf
// for its persistent state, with the VM, "<namespace>/<name>"; empty when
// it is neither.
func (a *ClaimBackupAction) markOf(namespace, claim string) (mark, vm string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	vms := &kubevirtv1.VirtualMachineList{}
	if err := withRetry(func() error { return a.client.List(ctx, vms, client.InNamespace(namespace)) }); err != nil {
		return "", "", fmt.Errorf("list VirtualMachines of namespace %s: %w", namespace, err)
	}
	var stateOf string
	if strings.HasPrefix(claim, stateClaimLabel+"-") {
		pvc := &corev1.PersistentVolumeClaim{}
		err := withRetry(func() error { return a.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claim}, pvc) })
		if err != nil && !apierrors.IsNotFound(err) {
			return "", "", fmt.Errorf("get PersistentVolumeClaim %s/%s: %w", namespace, claim, err)
		}
		stateOf = pvc.Labels[stateClaimLabel]
	}
	for i := range vms.Items {
		vm := &vms.Items[i]
		if !takesVM(vm) {
			continue
		}
		if vm.Name == stateOf {
			return AnnotationStateOf, vm.Namespace + "/" + vm.Name, nil
		}
		for _, d := range datamover.DiskClaims(vm) {
			if d.Name == claim {
				return AnnotationDiskOf, vm.Namespace + "/" + vm.Name, nil
			}
		}
	}
	return "", "", nil
}

// Progress has no operation to report: the action starts none.
func (a *ClaimBackupAction) Progress(operationID string, _ *velerov1.Backup) (velero.OperationProgress, error) {
	return velero.OperationProgress{}, biav2.InvalidOperationIDError(operationID)
}

// Cancel has no operation to cancel.
func (a *ClaimBackupAction) Cancel(string, *velerov1.Backup) error { return nil }

// ClaimRestoreAction is the RestoreItemAction (v2) on PersistentVolumeClaims
// and PersistentVolumes. It prepares what ClaimBackupAction marked as
// Velero's CSI PVC restore action prepares the claims of its data mover,
// which it leaves alone here (they carry no annotation of its own): the
// claim loses spec.volumeName and the PV controller's binding annotations
// and selects a fresh velero.io/dynamic-pv-restore label that no volume
// and no provisioner serves, keeping its storage class, size and modes, so
// that the DataDownload controller finds it unbound and binds the volume
// it restores to it. The volume the claim was bound to is not restored
// (SkipRestore), as Velero restores no volume whose claim a data mover
// restores. Restores with spec.restorePVs false get the items as Velero
// would restore them without the action.
type ClaimRestoreAction struct {
	withoutOperations
	log logrus.FieldLogger
}

// NewClaimRestoreAction returns the action.
func NewClaimRestoreAction(log logrus.FieldLogger) *ClaimRestoreAction {
	return &ClaimRestoreAction{log: log}
}

// Name is the name the action is registered under.
func (a *ClaimRestoreAction) Name() string { return ClaimRestoreActionName }

// AppliesTo selects claims and volumes.
func (a *ClaimRestoreAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{claims, volumes}}, nil
}

// Execute prepares a marked claim for its DataDownload, or skips a marked
// volume.
func (a *ClaimRestoreAction) Execute(in *velero.RestoreItemActionExecuteInput) (*velero.RestoreItemActionExecuteOutput, error) {
	fromBackup := in.ItemFromBackup
	if fromBackup == nil {
		fromBackup = in.Item
	}
	marks := (&unstructured.Unstructured{Object: fromBackup.UnstructuredContent()}).GetAnnotations()
	vm, stateOf := marks[AnnotationDiskOf], marks[AnnotationStateOf]
	if vm == "" && stateOf == "" {
		return velero.NewRestoreItemActionExecuteOutput(in.Item), nil
	}
	u := (&unstructured.Unstructured{Object: in.Item.UnstructuredContent()}).DeepCopy()
	annotations := u.GetAnnotations()
	delete(annotations, AnnotationDiskOf)
	delete(annotations, AnnotationStateOf)
	u.SetAnnotations(annotations)
	restore := in.Restore
	if r := restore.Spec.RestorePVs; r != nil && !*r {
		return velero.NewRestoreItemActionExecuteOutput(u), nil
	}
	if stateOf != "" {
		a.log.WithFields(logrus.Fields{"restore": restore.Namespace + "/" + restore.Name, "vm": stateOf}).
			Warnf("%s %s not restored: KubeVirt's persistent state of the VM, which KubeVirt makes anew when the restored VM starts; "+
				"its changed block tracking starts over, and a persistent vTPM or EFI variables, which the kubevirt data mover does not back up, start empty",
				u.GetKind(), u.GetName())
		return velero.NewRestoreItemActionExecuteOutput(u).WithoutRestore(), nil
	}
	log := a.log.WithFields(logrus.Fields{"restore": restore.Namespace + "/" + restore.Name, "vm": vm})
	if u.GetKind() == volumeKind {
		log.Infof("PersistentVolume %s not restored: the kubevirt data mover restores its claim into a volume of its own", u.GetName())
		return velero.NewRestoreItemActionExecuteOutput(u).WithoutRestore(), nil
	}

	target := u.GetNamespace()
	if ns, ok := restore.Spec.NamespaceMapping[target]; ok {
		target = ns
	}
	unstructured.RemoveNestedField(u.Object, "spec", "volumeName")
	// The PV controller's binding annotations, which Velero drops from a
	// claim it restores bound: the claim is bound anew.
	delete(annotations, kube.KubeAnnBindCompleted)
	delete(annotations, kube.KubeAnnBoundByController)
	u.SetAnnotations(annotations)
	value := label.GetValidName(fmt.Sprintf("%s.%s.%s", target, u.GetName(), utilrand.String(randomChars)))
	if err := unstructured.SetNestedField(u.Object, value, "spec", "selector", "matchLabels", velerov1.DynamicPVRestoreLabel); err != nil {
		return nil, fmt.Errorf("PersistentVolumeClaim %s/%s: spec.selector: %w", u.GetNamespace(), u.GetName(), err)
	}
	log.Infof("PersistentVolumeClaim %s/%s restored unbound, selecting %s=%s: the kubevirt data mover binds the disk it restores to it",
		target, u.GetName(), velerov1.DynamicPVRestoreLabel, value)
	return velero.NewRestoreItemActionExecuteOutput(u), nil
}
