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
	"errors"
	"fmt"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

// DataDownloadReconciler drives DataDownloads of spec.datamover "kubevirt":
// it restores one disk of a VM, as the backup its snapshot ID names saved
// it, into the target claim. It follows Velero's restore contract, as
// Velero's restore exposer does for its own data movers: the disk is
// written into a volume of the controller's own, provisioned for a claim in
// the DataDownload's namespace (Velero's) like the target claim, which
// Velero's restore left unbound; that volume is then bound to the target
// claim.
//
//	New         the snapshot ID parses: Accepted
//	Accepted    the location is Available, the target claim exists unbound
//	            and the backup holds the disk: the intermediate claim and
//	            the restore pod are created in Velero's namespace, Prepared
//	Prepared    the pod runs: InProgress
//	InProgress  the pod succeeded: its result is kept on the DataDownload,
//	            the pod and the intermediate claim go, the volume is bound
//	            to the target claim (volumeMove): Completed; the pod
//	            failed: Failed
//
// A Completed DataDownload that is the last of its restore operation's to
// complete restores the run strategy of the VM the restore item action
// stopped (resumeVM). Cancellation and timeouts work as for DataUploads;
// the pod and the intermediate claim are deleted at the end, and a volume
// still held is released.
type DataDownloadReconciler struct {
	Client   client.Client
	Reader   client.Reader
	Recorder record.EventRecorder
	Config   Config
	Now      func() time.Time
	// Metrics counts the downloads that end; nil counts nothing.
	Metrics *Metrics
	// openRepository opens a location's repository for the controller's
	// own reads; nil opens its bucket. Tests replace it.
	openRepository func(*location) (*backup.Repository, error)
}

func (r *DataDownloadReconciler) open(l *location) (*backup.Repository, error) {
	if r.openRepository != nil {
		return r.openRepository(l)
	}
	return l.open()
}

type downloadJob struct {
	dd     *velerov2.DataDownload
	vm     catalog.VM
	backup string
	disk   string
	// name of the pod and the intermediate claim in the DataDownload's
	// namespace.
	name string
}

func (j *downloadJob) targetNamespace() string {
	if ns := j.dd.Spec.TargetVolume.Namespace; ns != "" {
		return ns
	}
	return j.dd.Spec.SourceNamespace
}

// target is the claim the disk is restored into.
func (j *downloadJob) target() client.ObjectKey {
	return client.ObjectKey{Namespace: j.targetNamespace(), Name: j.dd.Spec.TargetVolume.PVC}
}

// key names the pod and the intermediate claim.
func (j *downloadJob) key() client.ObjectKey {
	return client.ObjectKey{Namespace: j.dd.Namespace, Name: j.name}
}

func (j *downloadJob) meta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: j.name, Namespace: j.dd.Namespace,
		Labels: ownerLabels(KindDataDownload, j.dd.UID), Annotations: ownerAnnotations(j.dd.Namespace, j.dd.Name)}
}

// AnnotationRestoreResult on a DataDownload keeps the restore pod's result
// while the volume it wrote is bound to the target claim: the pod goes
// first, as its claim cannot go while a pod uses it.
const AnnotationRestoreResult = "kubevirt-datamover.io/restore-result"

// AnnotationRestoreFinished on a DataDownload is when its restore pod's
// result was kept (RFC 3339): the end of the transfer, which the metrics
// time apart from the binding that follows.
const AnnotationRestoreFinished = "kubevirt-datamover.io/restore-finished"

func isOurDownload(o client.Object) bool {
	dd, ok := o.(*velerov2.DataDownload)
	return ok && dd.Spec.DataMover == DataMover
}

func downloadDone(p velerov2.DataDownloadPhase) bool {
	return p == velerov2.DataDownloadPhaseCompleted || p == velerov2.DataDownloadPhaseFailed || p == velerov2.DataDownloadPhaseCanceled
}

// SetupWithManager registers the controller and its watches.
func (r *DataDownloadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Config.defaults()
	if r.Now == nil {
		r.Now = time.Now
	}
	err := ctrl.NewControllerManagedBy(mgr).Named("kubevirt-datadownload").
		For(&velerov2.DataDownload{}, builder.WithPredicates(predicate.NewPredicateFuncs(isOurDownload))).
		Watches(&velerov1.BackupStorageLocation{}, handler.EnqueueRequestsFromMapFunc(r.usersOfLocation)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(ownerRequests(KindDataDownload))).
		Watches(&velerov2.DataDownload{}, handler.EnqueueRequestsFromMapFunc(r.siblings)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("set up the DataDownload controller: %w", err)
	}
	return nil
}

func (r *DataDownloadReconciler) usersOfLocation(ctx context.Context, o client.Object) []reconcile.Request {
	list := &velerov2.DataDownloadList{}
	if err := r.Client.List(ctx, list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, dd := range list.Items {
		if dd.Spec.DataMover == DataMover && dd.Spec.BackupStorageLocation == o.GetName() && !downloadDone(dd.Status.Phase) {
			reqs = append(reqs, reconcile.Request{NamespacedName: nn(dd.Namespace, dd.Name)})
		}
	}
	return reqs
}

// Reconcile moves one DataDownload on.
func (r *DataDownloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	dd := &velerov2.DataDownload{}
	if err := r.Client.Get(ctx, req.NamespacedName, dd); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if dd.Spec.DataMover != DataMover {
		return ctrl.Result{}, nil
	}
	backupName, ns, vm, err := ParseSnapshotID(dd.Spec.SnapshotID)
	if err != nil {
		if downloadDone(dd.Status.Phase) {
			return ctrl.Result{}, nil
		}
		op := r.op(dd)
		return ctrl.Result{}, op.setStatus(ctx, corev1.EventTypeWarning, "Failed", err.Error(), func() { op.end(velerov2.DataDownloadPhaseFailed) })
	}
	j := &downloadJob{dd: dd, vm: catalog.VM{Namespace: ns, Name: vm}, backup: backupName,
		disk: dd.Spec.TargetVolume.PVC, name: childName("kubevirt-restore", dd.Name)}
	if d := dd.Spec.DataMoverConfig[ConfigDisk]; d != "" {
		j.disk = d
	}
	op := r.op(dd, j.temporaries()...)
	op.release = func(ctx context.Context) error {
		return releaseVolume(ctx, r.Client, r.Reader, KindDataDownload, dd.UID, j.target())
	}
	if downloadDone(dd.Status.Phase) {
		if err := op.cleanup(ctx); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.resumeVM(ctx, dd)
	}
	if dd.Spec.Cancel || dd.Status.Phase == velerov2.DataDownloadPhaseCanceling {
		return op.cancel(ctx)
	}
	end, timeout := deadline(dd.CreationTimestamp, dd.Spec.OperationTimeout, r.Config.DefaultTimeout)
	left := end.Sub(r.Now())
	if left <= 0 {
		return op.fail(ctx, fmt.Sprintf("timed out after %s in phase %s", timeout, phaseName(dd.Status.Phase)))
	}
	switch dd.Status.Phase {
	case "", velerov2.DataDownloadPhaseNew:
		msg := fmt.Sprintf("accepted restore of disk %s of %s from backup %s", j.disk, j.vm, j.backup)
		err = r.setStatus(ctx, dd, corev1.EventTypeNormal, "Accepted", msg, func(s *velerov2.DataDownloadStatus) {
			s.Phase = velerov2.DataDownloadPhaseAccepted
			s.AcceptedByNode = r.Config.Identity
			s.AcceptedTimestamp = r.now()
		})
	case velerov2.DataDownloadPhaseAccepted:
		err = r.prepare(ctx, j)
	case velerov2.DataDownloadPhasePrepared, velerov2.DataDownloadPhaseInProgress:
		err = r.restore(ctx, j)
	}
	return op.result(ctx, err, left)
}

// unrestorable reports whether the store says for good that the backup
// cannot be restored: it does not hold it, a document its index names is
// missing, or what it holds is not a valid chain. A store that could not
// be read is worth a retry.
func unrestorable(err error) bool {
	var chainErr *catalog.ChainError
	return backup.IsNotFound(err) || errors.Is(err, objectstore.ErrNotFound) ||
		errors.As(err, &chainErr) || errors.Is(err, catalog.ErrTooNew)
}

// prepare checks the location, the target and the backup, then creates the
// intermediate claim and the restore pod.
func (r *DataDownloadReconciler) prepare(ctx context.Context, j *downloadJob) error {
	bsl, err := availableLocation(ctx, r.Client, r.Reader, j.dd.Namespace, j.dd.Spec.BackupStorageLocation, r.Config.PollInterval)
	if err != nil {
		return err
	}
	target := &corev1.PersistentVolumeClaim{}
	tkey := j.target()
	if err := r.Reader.Get(ctx, tkey, target); err != nil {
		if apierrors.IsNotFound(err) {
			return waitFor("WaitingForTarget", r.Config.PollInterval, "waiting for target claim %s", tkey)
		}
		return fmt.Errorf("get target claim %s: %w", tkey, err)
	}
	if target.Spec.VolumeName != "" {
		return fatal("target claim %s is already bound to volume %s: a restore binds a volume of its own to a claim "+
			"that Velero's restore left unbound (spec.volumeName empty)", tkey, target.Spec.VolumeName)
	}
	loc, err := usableLocation(ctx, r.Reader, bsl, r.Config.PollInterval)
	if err != nil {
		return err
	}
	repo, err := r.open(loc)
	if err != nil {
		return fatal("%w", err)
	}
	chain, err := repo.ResolveChain(ctx, j.backup, j.vm)
	if err != nil {
		if unrestorable(err) {
			return fatal("backup %s of %s: %w", j.backup, j.vm, err)
		}
		return fmt.Errorf("backup %s of %s: %w", j.backup, j.vm, err)
	}
	for _, c := range chain {
		found := false
		for _, f := range c.Files {
			found = found || f.DiskName == j.disk
		}
		if !found {
			return fatal("backup %s of %s holds no disk %s (checkpoint %s)", j.backup, j.vm, j.disk, c.ID)
		}
	}
	claim := intermediateClaim(j.meta(), target)
	if err := r.Client.Create(ctx, claim); err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFailure(err, "create intermediate claim %s", j.key())
	}
	opts := mover.RestoreOptions{VM: j.vm, Backup: j.backup, Disk: j.disk, Target: restoreTarget(claim),
		WorkDir: PodWorkDir, Credentials: credentialsFile(), BSL: loc.manifest,
		Progress: mover.ObjectRef{Namespace: j.dd.Namespace, Name: j.dd.Name}}
	pod := r.Config.restorePod(j.meta(), loc, claim, opts.Args(), opts.Env())
	if err := r.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFailure(err, "create restore pod %s", j.key())
	}
	msg := fmt.Sprintf("restore pod %s writes disk %s from a chain of %d into a volume for claim %s", j.key(), j.disk, len(chain), tkey)
	return r.setStatus(ctx, j.dd, corev1.EventTypeNormal, "Prepared", msg, func(s *velerov2.DataDownloadStatus) {
		s.Phase = velerov2.DataDownloadPhasePrepared
	})
}

// intermediateClaim asks for a volume like the target claim's (class, size,
// access and volume modes) in Velero's namespace, as Velero's restore
// exposer does. It binds where the restore pod runs: the target claim's
// consumer, the VM, is stopped while its disks are restored.
func intermediateClaim(meta metav1.ObjectMeta, target *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: meta, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      target.Spec.AccessModes,
		StorageClassName: target.Spec.StorageClassName,
		VolumeMode:       target.Spec.VolumeMode,
		Resources:        target.Spec.Resources,
	}}
}

func (r *DataDownloadReconciler) restore(ctx context.Context, j *downloadJob) error {
	message, kept := j.dd.Annotations[AnnotationRestoreResult]
	if !kept {
		pod := &corev1.Pod{}
		if err := getLatest(ctx, r.Client, r.Reader, j.key(), pod); err != nil {
			if apierrors.IsNotFound(err) {
				return fatal("restore pod %s disappeared", j.key())
			}
			return fmt.Errorf("get restore pod %s: %w", j.key(), err)
		}
		var finished, succeeded bool
		finished, succeeded, message = podOutcome(pod)
		switch {
		case !finished:
			if pod.Status.Phase == corev1.PodRunning && j.dd.Status.Phase == velerov2.DataDownloadPhasePrepared {
				return r.setStatus(ctx, j.dd, corev1.EventTypeNormal, "RestoreStarted", fmt.Sprintf("restore pod %s is running", j.key()),
					func(s *velerov2.DataDownloadStatus) {
						s.Phase = velerov2.DataDownloadPhaseInProgress
						s.StartTimestamp = r.now()
						s.Node = pod.Spec.NodeName
					})
			}
			return nil
		case !succeeded:
			return fatal("restore pod %s failed: %s", j.key(), firstLine(message))
		}
	}
	res, err := mover.DecodeRestoreResult(message)
	if err != nil {
		return fatal("%w", err)
	}
	if !kept {
		if err := r.keepResult(ctx, j.dd, message); err != nil {
			return err
		}
	}
	if err := deleteIfPresent(ctx, r.Client, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: j.dd.Namespace, Name: j.name}}); err != nil {
		return err
	}
	move := &volumeMove{client: r.Client, reader: r.Reader, kind: KindDataDownload, uid: j.dd.UID,
		owner: j.dd.Namespace + "/" + j.dd.Name, from: j.key(), to: j.target()}
	volume, err := move.run(ctx)
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("restored disk %s of %s from backup %s (chain of %d, %d bytes) into claim %s (volume %s)",
		j.disk, j.vm, j.backup, len(res.Chain), res.Bytes, j.target(), volume)
	op := r.op(j.dd, j.temporaries()...)
	if err := op.setStatus(ctx, corev1.EventTypeNormal, "Completed", msg, func() {
		op.end(velerov2.DataDownloadPhaseCompleted)
		j.dd.Status.Progress.TotalBytes, j.dd.Status.Progress.BytesDone = res.Bytes, res.Bytes
	}); err != nil {
		return err
	}
	if err := op.cleanup(ctx); err != nil {
		return err
	}
	return r.resumeVM(ctx, j.dd)
}

// keepResult records the pod's result on the DataDownload before the pod
// goes.
func (r *DataDownloadReconciler) keepResult(ctx context.Context, dd *velerov2.DataDownload, message string) error {
	patch := client.MergeFrom(dd.DeepCopy())
	if dd.Annotations == nil {
		dd.Annotations = map[string]string{}
	}
	dd.Annotations[AnnotationRestoreResult] = message
	dd.Annotations[AnnotationRestoreFinished] = r.Now().UTC().Format(time.RFC3339)
	if err := r.Client.Patch(ctx, dd, patch); err != nil {
		return fmt.Errorf("keep the restore result on DataDownload %s/%s: %w", dd.Namespace, dd.Name, err)
	}
	return nil
}

// temporaries are what a DataDownload creates in its namespace and its end
// deletes.
func (j *downloadJob) temporaries() []client.Object {
	meta := metav1.ObjectMeta{Name: j.name, Namespace: j.dd.Namespace}
	return []client.Object{&corev1.Pod{ObjectMeta: meta}, &corev1.PersistentVolumeClaim{ObjectMeta: meta}}
}

func (r *DataDownloadReconciler) op(dd *velerov2.DataDownload, temporaries ...client.Object) *operation[velerov2.DataDownloadPhase] {
	s := &dd.Status
	return &operation[velerov2.DataDownloadPhase]{kind: "DataDownload", obj: dd, phase: &s.Phase, message: &s.Message,
		start: &s.StartTimestamp, completion: &s.CompletionTimestamp, temporaries: temporaries,
		client: r.Client, recorder: r.Recorder, now: r.Now, metrics: r.Metrics}
}

func (r *DataDownloadReconciler) setStatus(ctx context.Context, dd *velerov2.DataDownload, eventType, reason, msg string, change func(*velerov2.DataDownloadStatus)) error {
	return r.op(dd).setStatus(ctx, eventType, reason, msg, func() { change(&dd.Status) })
}

func (r *DataDownloadReconciler) now() *metav1.Time {
	t := metav1.NewTime(r.Now())
	return &t
}
