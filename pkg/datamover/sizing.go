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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

// vmDisk is a volume of a VM backed by a claim.
type vmDisk struct {
	mover.Disk
	Size resource.Quantity
}

// backupOverhead is what a temporary volume holds beyond the disks' sizes:
// qcow2 metadata (about 1%) plus a fixed margin for the file system.
func backupOverhead(total int64) int64 { return total/100 + 64<<20 }

// vmDisks lists the VM's volumes backed by a claim (directly or through a
// DataVolume) with the claim's capacity. The claim's name is the disk name in
// the store, which is what a DataDownload's target volume names.
func vmDisks(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine) ([]vmDisk, error) {
	if vm.Spec.Template == nil {
		return nil, fatal("VirtualMachine %s/%s has no template", vm.Namespace, vm.Name)
	}
	var disks []vmDisk
	for _, d := range DiskClaims(vm) {
		size, err := claimSize(ctx, r, vm, d.Name)
		if err != nil {
			return nil, fmt.Errorf("volume %s of VirtualMachine %s/%s: %w", d.Volume, vm.Namespace, vm.Name, err)
		}
		disks = append(disks, vmDisk{Disk: d, Size: size})
	}
	if len(disks) == 0 {
		return nil, fatal("VirtualMachine %s/%s has no volume backed by a claim", vm.Namespace, vm.Name)
	}
	return disks, nil
}

// DiskClaims lists the VM's volumes that a backup saves: those backed by a
// claim, directly or through a DataVolume (whose claim has its name), in
// the template's order. Name is the claim, the disk's name in the store.
func DiskClaims(vm *kubevirtv1.VirtualMachine) []mover.Disk {
	if vm.Spec.Template == nil {
		return nil
	}
	var disks []mover.Disk
	for _, v := range vm.Spec.Template.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			disks = append(disks, mover.Disk{Volume: v.Name, Name: v.PersistentVolumeClaim.ClaimName})
		case v.DataVolume != nil:
			disks = append(disks, mover.Disk{Volume: v.Name, Name: v.DataVolume.Name})
		}
	}
	return disks
}

// claimSize is a claim's capacity, or what it requests while unbound, or
// what the VM's DataVolume template asks for before the claim exists. A
// claim that has no size, or that neither exists nor has a template, is
// fatal; a failed read is not.
func claimSize(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine, name string) (resource.Quantity, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: name}, pvc)
	switch {
	case err == nil:
		if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
			return q, nil
		}
		if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			return q, nil
		}
		return resource.Quantity{}, fatal("claim %s has no size", name)
	case !apierrors.IsNotFound(err):
		return resource.Quantity{}, fmt.Errorf("get claim %s: %w", name, err)
	}
	for _, t := range vm.Spec.DataVolumeTemplates {
		if t.Name != name {
			continue
		}
		if s := t.Spec.Storage; s != nil {
			if q, ok := s.Resources.Requests[corev1.ResourceStorage]; ok {
				return q, nil
			}
		}
		if p := t.Spec.PVC; p != nil {
			if q, ok := p.Resources.Requests[corev1.ResourceStorage]; ok {
				return q, nil
			}
		}
	}
	return resource.Quantity{}, fatal("claim %s: %w", name, err)
}

// backupVolumeSize is the temporary volume's size for a full backup of the
// disks, rounded up to MiB.
func backupVolumeSize(disks []vmDisk) resource.Quantity {
	var total int64
	for _, d := range disks {
		total += d.Size.Value()
	}
	total += backupOverhead(total)
	const mi = 1 << 20
	total = (total + mi - 1) / mi * mi
	return *resource.NewQuantity(total, resource.BinarySI)
}
