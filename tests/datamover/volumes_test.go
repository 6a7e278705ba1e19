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

package datamover_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// volumes is the stand-ins' storage: every PersistentVolume is a host
// directory, which follows the volume from claim to claim.
type volumes struct{ root string }

func (v volumes) dir(volume string) string { return filepath.Join(v.root, volume) }

// claimDir is the directory of the volume bound to a claim.
func (v volumes) claimDir(ctx context.Context, c client.Reader, namespace, claim string) (string, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claim}, pvc); err != nil {
		return "", err
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return "", errUnbound
	}
	return v.dir(pvc.Spec.VolumeName), nil
}

var errUnbound = errors.New("claim not bound yet")

// The finalizers Kubernetes' storage object in-use protection admission
// puts on claims and volumes.
const (
	pvcProtection = "kubernetes.io/pvc-protection"
	pvProtection  = "kubernetes.io/pv-protection"
)

// volumeControllerStandIn plays kube-controller-manager's volume
// controllers and a dynamic provisioner — it is neither. It provisions a
// volume (a directory) for an unbound claim that has no selector, binds a
// claim to the volume it names once the volume's claimRef names the claim
// too, deletes a volume of reclaim policy Delete whose claim is gone, and
// lifts the protection of a deleted claim no pod uses, as they would.
type volumeControllerStandIn struct {
	c    client.Client
	vols volumes
}

func (s *volumeControllerStandIn) run(ctx context.Context) {
	everyTick(ctx, "volume controller stand-in", s.step)
}

func (s *volumeControllerStandIn) step(ctx context.Context) error {
	claims := &corev1.PersistentVolumeClaimList{}
	if err := s.c.List(ctx, claims); err != nil {
		return fmt.Errorf("list claims: %w", err)
	}
	pods := &corev1.PodList{}
	if err := s.c.List(ctx, pods); err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		var err error
		switch {
		case pvc.DeletionTimestamp != nil:
			err = s.unprotect(ctx, pvc, pods.Items)
		case pvc.Spec.VolumeName == "" && pvc.Spec.Selector == nil:
			err = s.provision(ctx, pvc)
		case pvc.Spec.VolumeName != "" && pvc.Status.Phase != corev1.ClaimBound:
			err = s.bind(ctx, pvc)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", pvc.Namespace, pvc.Name, err))
		}
	}
	pvs := &corev1.PersistentVolumeList{}
	if err := s.c.List(ctx, pvs); err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	for i := range pvs.Items {
		if err := s.reclaim(ctx, &pvs.Items[i]); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", pvs.Items[i].Name, err))
		}
	}
	return errors.Join(errs...)
}

// unprotect removes the protection of a deleted claim that no pod uses.
func (s *volumeControllerStandIn) unprotect(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pods []corev1.Pod) error {
	if !slices.Contains(pvc.Finalizers, pvcProtection) {
		return nil
	}
	for _, pod := range pods {
		if pod.Namespace != pvc.Namespace {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc.Name {
				return nil
			}
		}
	}
	pvc.Finalizers = slices.DeleteFunc(pvc.Finalizers, func(f string) bool { return f == pvcProtection })
	return client.IgnoreNotFound(s.c.Update(ctx, pvc))
}

// provision makes a volume for the claim, bound to it, as a provisioner
// and the PV controller together would.
func (s *volumeControllerStandIn) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	name := "pvc-" + string(pvc.UID)
	if err := os.MkdirAll(s.vols.dir(name), 0o755); err != nil {
		return err
	}
	pv := &corev1.PersistentVolume{}
	pv.Name = name
	pv.Spec = corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]},
		AccessModes:                   pvc.Spec.AccessModes,
		VolumeMode:                    pvc.Spec.VolumeMode,
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: s.vols.dir(name)}},
	}
	if pvc.Spec.StorageClassName != nil {
		pv.Spec.StorageClassName = *pvc.Spec.StorageClassName
	}
	if err := s.c.Create(ctx, pv); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pvc.Spec.VolumeName = name
	if err := s.c.Update(ctx, pvc); err != nil {
		return err
	}
	return s.bind(ctx, pvc)
}

// bind completes the binding of a claim naming a volume whose claimRef
// names the claim; a volume that names another claim leaves it Pending.
func (s *volumeControllerStandIn) bind(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	pv := &corev1.PersistentVolume{}
	if err := s.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
		return client.IgnoreNotFound(err)
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Namespace != pvc.Namespace || ref.Name != pvc.Name || ref.UID != "" && ref.UID != pvc.UID {
		return nil
	}
	if ref.UID == "" {
		ref.UID = pvc.UID
		if err := s.c.Update(ctx, pv); err != nil {
			return err
		}
	}
	pv.Status.Phase = corev1.VolumeBound
	if err := s.c.Status().Update(ctx, pv); err != nil {
		return err
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pv.Spec.AccessModes
	pvc.Status.Capacity = pv.Spec.Capacity
	return s.c.Status().Update(ctx, pvc)
}

// reclaim deletes a volume of reclaim policy Delete whose claim is gone,
// and its directory; a retained one becomes Released.
func (s *volumeControllerStandIn) reclaim(ctx context.Context, pv *corev1.PersistentVolume) error {
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		return nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	err := s.c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, pvc)
	if err == nil && pvc.UID == ref.UID {
		return nil
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		if pv.Status.Phase == corev1.VolumeReleased {
			return nil
		}
		pv.Status.Phase = corev1.VolumeReleased
		return s.c.Status().Update(ctx, pv)
	}
	if err := os.RemoveAll(s.vols.dir(pv.Name)); err != nil {
		return err
	}
	if slices.Contains(pv.Finalizers, pvProtection) {
		pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == pvProtection })
		if err := s.c.Update(ctx, pv); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	return client.IgnoreNotFound(s.c.Delete(ctx, pv, client.Preconditions{UID: ptrUID(pv.UID)}))
}

func ptrUID(uid types.UID) *types.UID { return &uid }
