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
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationReclaimPolicy on a PersistentVolume the controller moves from
// one claim to another keeps the reclaim policy the move holds at Retain.
const AnnotationReclaimPolicy = "kubevirt-datamover.io/reclaim-policy"

// The PV controller's binding annotations, which a rebind drops as
// Velero's does: the controller binds the pair anew.
const (
	annBindCompleted     = "pv.kubernetes.io/bind-completed"
	annBoundByController = "pv.kubernetes.io/bound-by-controller"
)

// movePause is how often a move looks again at what it waits for (a claim
// to go, the PV controller to bind): the controller does not watch
// volumes and claims.
const movePause = time.Second

// volumeMove moves the PersistentVolume bound to claim from onto claim to,
// as Velero's restore exposer rebinds a restored volume (RebindVolume): the
// volume is held at reclaim policy Retain and labelled with its owner, from
// is deleted, to names the volume (spec.volumeName) and the volume to
// (spec.claimRef); once the PV controller has bound the two, the volume
// gets its reclaim policy back. Every step is idempotent: a reconcile runs
// the move until it reports the volume bound.
type volumeMove struct {
	client client.Client
	// reader reads volumes and claims from the API server: they are not
	// cached.
	reader client.Reader
	// kind and uid of the DataUpload or DataDownload, which label the
	// volume while it moves.
	kind string
	uid  types.UID
	// owner is "<namespace>/<name>" of the DataUpload or DataDownload.
	owner    string
	from, to client.ObjectKey
	// newClaim makes claim to, bound to the volume, when it does not
	// exist; nil requires it to exist.
	newClaim func(*corev1.PersistentVolume) *corev1.PersistentVolumeClaim
}

func (m *volumeMove) labels() client.MatchingLabels {
	return client.MatchingLabels(ownerLabels(m.kind, m.uid))
}

// run takes the move one step on; it returns the volume's name once the
// volume is bound to claim to, else a wait or an error.
func (m *volumeMove) run(ctx context.Context) (string, error) {
	pv, err := heldVolume(ctx, m.reader, m.kind, m.uid)
	if err != nil {
		return "", err
	}
	if pv == nil {
		done, held, err := m.hold(ctx)
		if err != nil || done != "" {
			return done, err
		}
		pv = held
	}
	if err := m.releaseFrom(ctx); err != nil {
		return "", err
	}
	to, err := m.claimTo(ctx, pv)
	if err != nil {
		return "", err
	}
	if err := m.pointTo(ctx, pv, to); err != nil {
		return "", err
	}
	if pv.Status.Phase != corev1.VolumeBound || pv.Spec.ClaimRef.UID != to.UID || to.Status.Phase != corev1.ClaimBound {
		return "", waitFor("WaitingForBinding", movePause, "waiting for volume %s to bind to claim %s", pv.Name, m.to)
	}
	if err := giveBack(ctx, m.client, pv, pv.Annotations[AnnotationReclaimPolicy]); err != nil {
		return "", err
	}
	return pv.Name, nil
}

// heldVolume is the volume an operation holds, if any: the one labelled
// with its owner.
func heldVolume(ctx context.Context, r client.Reader, kind string, uid types.UID) (*corev1.PersistentVolume, error) {
	list := &corev1.PersistentVolumeList{}
	if err := r.List(ctx, list, client.MatchingLabels(ownerLabels(kind, uid))); err != nil {
		return nil, fmt.Errorf("list the volumes of %s %s: %w", kind, uid, err)
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	return &list.Items[0], nil
}

// hold labels and retains the volume bound to claim from. A move whose
// claim from is gone either ended (the volume is bound to claim to, its
// name is returned) or lost the volume.
func (m *volumeMove) hold(ctx context.Context) (done string, pv *corev1.PersistentVolume, err error) {
	from := &corev1.PersistentVolumeClaim{}
	if err := m.reader.Get(ctx, m.from, from); apierrors.IsNotFound(err) {
		to := &corev1.PersistentVolumeClaim{}
		if err := m.reader.Get(ctx, m.to, to); err == nil && to.Spec.VolumeName != "" && to.Status.Phase == corev1.ClaimBound {
			return to.Spec.VolumeName, nil, nil
		} else if err != nil && !apierrors.IsNotFound(err) {
			return "", nil, fmt.Errorf("get claim %s: %w", m.to, err)
		}
		return "", nil, fatal("claim %s disappeared before its volume was bound to claim %s", m.from, m.to)
	} else if err != nil {
		return "", nil, fmt.Errorf("get claim %s: %w", m.from, err)
	}
	if from.DeletionTimestamp != nil {
		return "", nil, fatal("claim %s is being deleted before its volume was bound to claim %s", m.from, m.to)
	}
	if from.Spec.VolumeName == "" || from.Status.Phase != corev1.ClaimBound {
		return "", nil, waitFor("WaitingForVolume", movePause, "waiting for claim %s to be bound", m.from)
	}
	pv = &corev1.PersistentVolume{}
	if err := m.reader.Get(ctx, client.ObjectKey{Name: from.Spec.VolumeName}, pv); err != nil {
		return "", nil, fmt.Errorf("get volume %s of claim %s: %w", from.Spec.VolumeName, m.from, err)
	}
	patch := client.MergeFrom(pv.DeepCopy())
	if pv.Labels == nil {
		pv.Labels = map[string]string{}
	}
	for k, v := range m.labels() {
		pv.Labels[k] = v
	}
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	pv.Annotations[AnnotationOwner] = m.owner
	pv.Annotations[AnnotationReclaimPolicy] = string(pv.Spec.PersistentVolumeReclaimPolicy)
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	if err := m.client.Patch(ctx, pv, patch); err != nil {
		return "", nil, apiFailure(err, "retain volume %s of claim %s", pv.Name, m.from)
	}
	return "", pv, nil
}

// releaseFrom deletes claim from and waits until it is gone (the claim's
// protection keeps it while a pod uses it).
func (m *volumeMove) releaseFrom(ctx context.Context) error {
	from := &corev1.PersistentVolumeClaim{}
	if err := m.reader.Get(ctx, m.from, from); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("get claim %s: %w", m.from, err)
	}
	if from.DeletionTimestamp == nil {
		if err := deleteIfPresent(ctx, m.client, from); err != nil {
			return err
		}
	}
	return waitFor("WaitingForClaimDeletion", movePause, "waiting for claim %s to be deleted", m.from)
}

// claimTo makes claim to name the volume; a claim bound to another volume
// fails the move.
func (m *volumeMove) claimTo(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	to := &corev1.PersistentVolumeClaim{}
	err := m.reader.Get(ctx, m.to, to)
	switch {
	case apierrors.IsNotFound(err) && m.newClaim != nil:
		to = m.newClaim(pv)
		if err := m.client.Create(ctx, to); err != nil {
			return nil, apiFailure(err, "create claim %s for volume %s", m.to, pv.Name)
		}
		return to, nil
	case apierrors.IsNotFound(err):
		return nil, fatal("claim %s not found", m.to)
	case err != nil:
		return nil, fmt.Errorf("get claim %s: %w", m.to, err)
	}
	switch to.Spec.VolumeName {
	case pv.Name:
		return to, nil
	case "":
	default:
		return nil, fatal("claim %s is bound to volume %s, not to volume %s", m.to, to.Spec.VolumeName, pv.Name)
	}
	patch := client.MergeFromWithOptions(to.DeepCopy(), client.MergeFromWithOptimisticLock{})
	to.Spec.VolumeName = pv.Name
	delete(to.Annotations, annBindCompleted)
	delete(to.Annotations, annBoundByController)
	if err := m.client.Patch(ctx, to, patch); err != nil {
		return nil, apiFailure(err, "bind claim %s to volume %s", m.to, pv.Name)
	}
	return to, nil
}

// pointTo makes the volume's claimRef name claim to, and gives the volume
// the labels the claim selects (Velero's restore selects with
// velero.io/dynamic-pv-restore).
func (m *volumeMove) pointTo(ctx context.Context, pv *corev1.PersistentVolume, to *corev1.PersistentVolumeClaim) error {
	if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == to.Namespace && ref.Name == to.Name {
		return nil
	}
	patch := client.MergeFrom(pv.DeepCopy())
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: to.Namespace, Name: to.Name}
	delete(pv.Annotations, annBoundByController)
	if sel := to.Spec.Selector; sel != nil {
		for k, v := range sel.MatchLabels {
			if _, ok := pv.Labels[k]; !ok {
				pv.Labels[k] = v
			}
		}
	}
	if err := m.client.Patch(ctx, pv, patch); err != nil {
		return apiFailure(err, "point volume %s to claim %s", pv.Name, m.to)
	}
	return nil
}

// giveBack ends a hold on a volume: its owner's labels and annotations go,
// and it gets policy as its reclaim policy.
func giveBack(ctx context.Context, c client.Client, pv *corev1.PersistentVolume, policy string) error {
	patch := client.MergeFrom(pv.DeepCopy())
	delete(pv.Labels, LabelOwnerKind)
	delete(pv.Labels, LabelOwnerUID)
	delete(pv.Annotations, AnnotationOwner)
	delete(pv.Annotations, AnnotationReclaimPolicy)
	if policy != "" {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(policy)
	}
	if err := c.Patch(ctx, pv, patch); err != nil {
		return fmt.Errorf("give back volume %s: %w", pv.Name, err)
	}
	return nil
}

// releaseVolume gives up the volume an ended operation still holds, as
// Velero's exposers clean up theirs: a volume bound to claim keep (the
// user's claim of a restore) stays with it and gets its reclaim policy
// back; any other is to be deleted with its claim (reclaim policy Delete),
// its content being of no further use.
func releaseVolume(ctx context.Context, c client.Client, r client.Reader, kind string, uid types.UID, keep client.ObjectKey) error {
	pv, err := heldVolume(ctx, r, kind, uid)
	if err != nil || pv == nil {
		return err
	}
	if ref := pv.Spec.ClaimRef; ref != nil && keep.Name != "" && ref.Namespace == keep.Namespace && ref.Name == keep.Name {
		claim := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, keep, claim); err == nil && claim.Spec.VolumeName == pv.Name {
			return giveBack(ctx, c, pv, pv.Annotations[AnnotationReclaimPolicy])
		} else if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("get claim %s: %w", keep, err)
		}
	}
	return giveBack(ctx, c, pv, string(corev1.PersistentVolumeReclaimDelete))
}
