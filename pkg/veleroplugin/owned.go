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
	"github.com/sirupsen/logrus"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// KubeVirt's pods, by their kubevirt.io label: a VMI's virt-launcher pod
// and the attachment pods of its hotplugged volumes.
var kubevirtPods = map[string]bool{"virt-launcher": true, "hotplug-disk": true}

// OwnedRestoreAction is the RestoreItemAction (v2) on Pods and
// VirtualMachineInstances that keeps out of a restore what KubeVirt makes
// for a VM: its VMI, the VMI's virt-launcher pod and its attachment pods.
// KubeVirt makes them anew when the restored VM runs. Restored, they
// would be a VMI of the VM besides the one virt-controller starts, and
// pods that run QEMU or hold volumes with no VMI of theirs. A VMI that
// no VM owns is the user's own object and is restored.
type OwnedRestoreAction struct {
	withoutOperations
	log logrus.FieldLogger
}

// NewOwnedRestoreAction returns the action.
func NewOwnedRestoreAction(log logrus.FieldLogger) *OwnedRestoreAction {
	return &OwnedRestoreAction{log: log}
}

// Name is the name the action is registered under.
func (a *OwnedRestoreAction) Name() string { return OwnedRestoreActionName }

// AppliesTo selects Pods and VirtualMachineInstances.
func (a *OwnedRestoreAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{"pods", virtualMachineInstances}}, nil
}

// Execute skips the item when KubeVirt makes it for a VM.
func (a *OwnedRestoreAction) Execute(in *velero.RestoreItemActionExecuteInput) (*velero.RestoreItemActionExecuteOutput, error) {
	out := velero.NewRestoreItemActionExecuteOutput(in.Item)
	saved := in.ItemFromBackup
	if saved == nil {
		saved = in.Item
	}
	u := &unstructured.Unstructured{Object: saved.UnstructuredContent()}
	var owned bool
	switch u.GetKind() {
	case "Pod":
		owned = kubevirtPods[u.GetLabels()[kubevirtv1.AppLabel]]
	case kubevirtv1.VirtualMachineInstanceGroupVersionKind.Kind:
		owner := metav1.GetControllerOfNoCopy(u)
		owned = owner != nil && owner.Kind == kubevirtv1.VirtualMachineGroupVersionKind.Kind
	}
	if !owned {
		return out, nil
	}
	a.log.WithField("item", u.GetNamespace()+"/"+u.GetName()).Infof("%s not restored: KubeVirt makes it for the restored VM", u.GetKind())
	return out.WithoutRestore(), nil
}
