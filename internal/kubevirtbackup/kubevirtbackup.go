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
// (backup.kubevirt.io/v1alpha1) that the datamover uses. The API ships in
// kubevirt.io/api v1.8.0 and, with other conditions, v1.9.0, while this
// module pins v1.7.0: the fields used are mirrored in minimal local types
// and exchanged with the API server as unstructured objects, and the end
// of a backup is read as either version reports it. Drop the package for
// KubeVirt's own types once the module moves to a KubeVirt that has them.
package kubevirtbackup

import (
	"fmt"
	"strings"

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

	// KubeVirt v1.9 and later end a backup with Complete or Failed True,
	// the failure's cause in its message.
	ConditionComplete = "Complete"
	ConditionFailed   = "Failed"

	// KubeVirt v1.8 ends a backup, successful or not, with Done True; only
	// the reason, free text, tells a failure: "Backup has failed: <cause>".
	// A success reads "Successfully completed VirtualMachineBackup" or
	// "Completed VirtualMachineBackup, warning: <warning>".
	ConditionDone          = "Done"
	DoneReasonFailedPrefix = "Backup has failed: "
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

// condition returns the condition t of the backup when it is True.
func (b *VMBackup) condition(t string) *metav1.Condition {
	if b.Status == nil {
		return nil
	}
	for i, c := range b.Status.Conditions {
		if c.Type == t {
			if c.Status != metav1.ConditionTrue {
				return nil
			}
			return &b.Status.Conditions[i]
		}
	}
	return nil
}

// doneFailed tells, for KubeVirt v1.8's Done condition, whether the backup
// ended and whether it failed, with the cause.
func (b *VMBackup) doneFailed() (done, failed bool, cause string) {
	c := b.condition(ConditionDone)
	if c == nil {
		return false, false, ""
	}
	if cause, ok := strings.CutPrefix(c.Reason, DoneReasonFailedPrefix); ok {
		return true, true, cause
	}
	return true, false, ""
}

// Succeeded reports a completed backup: Complete (KubeVirt v1.9), or Done
// without a failure (v1.8).
func (b *VMBackup) Succeeded() bool {
	if b.condition(ConditionComplete) != nil {
		return true
	}
	done, failed, _ := b.doneFailed()
	return done && !failed
}

// Failed reports a failed backup and why: Failed (KubeVirt v1.9), or Done
// with a failure's reason (v1.8).
func (b *VMBackup) Failed() (bool, string) {
	if c := b.condition(ConditionFailed); c != nil {
		return true, c.Message
	}
	_, failed, cause := b.doneFailed()
	return failed, cause
}

// Stage is what KubeVirt says the backup is doing before it ends: the
// type and reason of its True conditions, empty when it says nothing yet.
func (b *VMBackup) Stage() string {
	if b.Status == nil {
		return ""
	}
	var says []string
	for _, c := range b.Status.Conditions {
		if c.Status == metav1.ConditionTrue {
			says = append(says, strings.TrimSuffix(c.Type+": "+c.Reason, ": "))
		}
	}
	return strings.Join(says, "; ")
}

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
