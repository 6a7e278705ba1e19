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

// Package datamover is the Velero data mover for KubeVirt VMs whose disks are
// backed up as qcow2 files: controllers that drive DataUploads and
// DataDownloads with spec.datamover "kubevirt" through Velero's phases, by
// way of KubeVirt's VirtualMachineBackup, a temporary volume, and pods that
// run package mover against the backup storage location.
package datamover

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// DataMover is the spec.datamover value this controller serves.
const DataMover = "kubevirt"

// Annotations a DataUpload carries (set by the backup item action) or that
// steer it. Where OADP's kubevirt data mover has a name for the same thing,
// the name is OADP's.
const (
	// AnnotationVMName and AnnotationVMNamespace name the VirtualMachine a
	// DataUpload backs up; the namespace defaults to spec.sourceNamespace.
	AnnotationVMName      = "kubevirt-datamover.io/vm-name"
	AnnotationVMNamespace = "kubevirt-datamover.io/vm-namespace"
	// AnnotationBackupName names the Velero backup when the DataUpload has
	// no velero.io/backup-name label.
	AnnotationBackupName = "kubevirt-datamover.io/backup-name"
	// AnnotationForceFull "true" (in any case) makes the backup full.
	AnnotationForceFull = "kubevirt-datamover.io/force-full-backup"
	// AnnotationForceFullLegacy is what AnnotationForceFull was called
	// before it took OADP's name; it is still honoured.
	AnnotationForceFullLegacy = "kubevirt-datamover.io/force-full"
	// AnnotationBackupPVCSize overrides the temporary volume's size.
	AnnotationBackupPVCSize = "kubevirt-datamover.io/backup-pvc-size"
	// AnnotationOperationID is the Velero asynchronous operation a
	// DataUpload or DataDownload serves (also its
	// velero.io/async-operation-id label).
	AnnotationOperationID = "kubevirt-datamover.io/operation-id"
)

// Annotations the restore item action puts on a VirtualMachine it restores
// stopped, so that its run strategy can be put back once its disks are
// restored: the strategy it had (Always, Halted, ...) and the field that
// held it ("runStrategy", or "running" for the deprecated boolean).
const (
	AnnotationOriginalRunStrategy       = "kubevirt-datamover.io/original-run-strategy"
	AnnotationOriginalRunStrategySource = "kubevirt-datamover.io/original-run-strategy-source"
)

// Keys of spec.dataMoverConfig.
const (
	// ConfigMaxChainLength caps the layers of a chain (full base included).
	ConfigMaxChainLength = "maxChainLength"
	// ConfigStorageClass is the temporary volume's storage class.
	ConfigStorageClass = "storageClass"
	// ConfigDisk names the disk a DataDownload restores; the default is
	// the target claim's name.
	ConfigDisk = "disk"
)

// Labels and annotations on what the controller creates, which tie it to its
// DataUpload or DataDownload (in another namespace, so no owner reference).
const (
	LabelOwnerKind = "kubevirt-datamover.io/owner-kind"
	LabelOwnerUID  = "kubevirt-datamover.io/owner-uid"
	// AnnotationOwner is "<namespace>/<name>" of the owner.
	AnnotationOwner = "kubevirt-datamover.io/owner"
	// LabelVM marks the tracker the controller keeps for a VM.
	LabelVM = "kubevirt-datamover.io/vm"

	// Annotations on the VirtualMachineBackup recording the plan.
	AnnotationPlanType   = "kubevirt-datamover.io/plan-type"
	AnnotationPlanParent = "kubevirt-datamover.io/plan-parent"
	AnnotationPlanReason = "kubevirt-datamover.io/plan-reason"
	// AnnotationInstance on the VirtualMachineBackup is the UID of the
	// VM's instance the backup is of.
	AnnotationInstance = "kubevirt-datamover.io/instance"

	// LabelBackupName is Velero's label naming the backup of a DataUpload.
	LabelBackupName = "velero.io/backup-name"
)

// Owner kinds.
const (
	KindDataUpload   = "DataUpload"
	KindDataDownload = "DataDownload"
)

// Keys of status.dataMoverResult of a completed DataUpload.
const (
	ResultCheckpoint = "checkpoint"
	ResultType       = "type"
	ResultParent     = "parent"
	ResultBytes      = "bytesUploaded"
	ResultFullReason = "fullReason"
)

// SnapshotID is what a completed DataUpload reports and a DataDownload
// restores from: "<backup>/<vm namespace>/<vm name>".
func SnapshotID(backupName, namespace, vm string) string {
	return backupName + "/" + namespace + "/" + vm
}

// ParseSnapshotID splits a SnapshotID.
func ParseSnapshotID(id string) (backupName, namespace, vm string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", fmt.Errorf("snapshot ID %q: want <backup>/<vm namespace>/<vm name>", id)
	}
	return parts[0], parts[1], parts[2], nil
}

// childName derives the name of an object made for owner: prefix-owner,
// shortened with a digest to fit a label value and a DNS label.
func childName(prefix, owner string) string {
	name := prefix + "-" + owner
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(owner))
	return name[:63-9] + "-" + hex.EncodeToString(sum[:])[:8]
}

// trackerName is the VirtualMachineBackupTracker the controller keeps for a
// VM.
func trackerName(vm string) string { return childName("datamover", vm) }

func ownerLabels(kind string, uid types.UID) map[string]string {
	return map[string]string{LabelOwnerKind: kind, LabelOwnerUID: string(uid)}
}

func ownerAnnotations(namespace, name string) map[string]string {
	return map[string]string{AnnotationOwner: namespace + "/" + name}
}

// ownerOf reads the owner of an object the controller created.
func ownerOf(labels, annotations map[string]string, kind string) (types.NamespacedName, bool) {
	if labels[LabelOwnerKind] != kind {
		return types.NamespacedName{}, false
	}
	ns, name, ok := strings.Cut(annotations[AnnotationOwner], "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}

// ForceFull tells whether annotations ask for a full backup, under either
// name: the plugin reads them on a Velero backup and its VM, the
// controller on the DataUpload.
func ForceFull(annotations map[string]string) bool {
	return strings.EqualFold(annotations[AnnotationForceFull], "true") ||
		strings.EqualFold(annotations[AnnotationForceFullLegacy], "true")
}
