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

// Package kubevirtbackup mirrors the part of KubeVirt's backup API
// (backup.kubevirt.io/v1alpha1) that the datamover uses. The API first
// ships in kubevirt.io/api v1.9.0, while this module pins v1.7.0: the
// fields used are mirrored in minimal local types and exchanged with the
// API server as unstructured objects. Drop the package for KubeVirt's own
// types once the module moves to v1.9.0.
package kubevirtbackup

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The kinds mirrored.
var (
	VMBackupGVK        = schema.GroupVersionKind{Group: "backup.kubevirt.io", Version: "v1alpha1", Kind: "VirtualMachineBackup"}
	VMBackupTrackerGVK = schema.GroupVersionKind{Group: "backup.kubevirt.io", Version: "v1alpha1", Kind: "VirtualMachineBackupTracker"}
)

// KubeVirt's names for backup types, modes and conditions.
const (
	BackupTypeFull        = "Full"
	BackupTypeIncremental = "Incremental"
	BackupModePush        = "Push"
	ConditionComplete     = "Complete"
	ConditionFailed       = "Failed"
)

// VMBackup mirrors VirtualMachineBackup.
type VMBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              VMBackupSpec    `json:"spec"`
	Status            *VMBackupStatus `json:"status,omitempty"`
}

// VMBackupSpec mirrors VirtualMachineBackupSpec.
type VMBackupSpec struct {
	Source          corev1.TypedLocalObjectReference `json:"source"`
	Mode            string                           `json:"mode,omitempty"`
	PVCName         string                           `json:"pvcName,omitempty"`
	SkipQuiesce     bool                             `json:"skipQuiesce,omitempty"`
	ForceFullBackup bool                             `json:"forceFullBackup,omitempty"`
}

// VMBackupStatus mirrors VirtualMachineBackupStatus.
type VMBackupStatus struct {
	Type            string             `json:"type,omitempty"`
	Conditions      []metav1.Condition `json:"conditions,omitempty"`
	CheckpointName  string             `json:"checkpointName,omitempty"`
	IncludedVolumes []BackupVolumeInfo `json:"includedVolumes,omitempty"`
}

// BackupVolumeInfo mirrors KubeVirt's BackupVolumeInfo.
type BackupVolumeInfo struct {
	VolumeName string `json:"volumeName"`
	DiskTarget string `json:"diskTarget,omitempty"`
}

// VMBackupTracker mirrors VirtualMachineBackupTracker.
type VMBackupTracker struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              VMBackupTrackerSpec    `json:"spec"`
	Status            *VMBackupTrackerStatus `json:"status,omitempty"`
}

// VMBackupTrackerSpec mirrors VirtualMachineBackupTrackerSpec.
type VMBackupTrackerSpec struct {
	Source corev1.TypedLocalObjectReference `json:"source"`
}

// VMBackupTrackerStatus mirrors VirtualMachineBackupTrackerStatus.
type VMBackupTrackerStatus struct {
	LatestCheckpoint               *BackupCheckpoint `json:"latestCheckpoint,omitempty"`
	CheckpointRedefinitionRequired *bool             `json:"checkpointRedefinitionRequired,omitempty"`
}

// BackupCheckpoint mirrors KubeVirt's BackupCheckpoint.
type BackupCheckpoint struct {
	Name         string             `json:"name,omitempty"`
	CreationTime *metav1.Time       `json:"creationTime,omitempty"`
	Volumes      []BackupVolumeInfo `json:"volumes,omitempty"`
}

// condition returns the status of a condition of the backup, and its
// message.
func (b *VMBackup) condition(t string) (bool, string) {
	if b.Status == nil {
		return false, ""
	}
	for _, c := range b.Status.Conditions {
		if c.Type == t {
			return c.Status == metav1.ConditionTrue, c.Message
		}
	}
	return false, ""
}

// Succeeded reports a completed backup.
func (b *VMBackup) Succeeded() bool { ok, _ := b.condition(ConditionComplete); return ok }

// Failed reports a failed backup and why.
func (b *VMBackup) Failed() (bool, string) { return b.condition(ConditionFailed) }

// LatestCheckpoint is the tracker's checkpoint an incremental can start
// from, or empty. A checkpoint KubeVirt still has to redefine after a VM
// restart is not yet usable.
func (t *VMBackupTracker) LatestCheckpoint() string {
	if t.Status == nil || t.Status.LatestCheckpoint == nil {
		return ""
	}
	if r := t.Status.CheckpointRedefinitionRequired; r != nil && *r {
		return ""
	}
	return t.Status.LatestCheckpoint.Name
}

// ToUnstructured converts a local mirror for the API server.
func ToUnstructured(obj any, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", gvk.Kind, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// FromUnstructured fills a local mirror from the API server's object.
func FromUnstructured(u *unstructured.Unstructured, obj any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return fmt.Errorf("decode %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// NewUnstructured returns an empty object of kind gvk, to read into.
func NewUnstructured(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}
