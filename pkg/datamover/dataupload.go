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
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

// indexVM indexes DataUploads by "<namespace>/<name>" of their VM.
const indexVM = "kubevirt-datamover.io/vm"

// AnnotationDisks on the VirtualMachineBackup records the volumes and their
// claims as they were when the backup began: "<volume>=<claim>:<size>,...".
const AnnotationDisks = "kubevirt-datamover.io/disks"

// DataUploadReconciler drives DataUploads of spec.datamover "kubevirt":
//
//	New         the VM is running: Accepted
//	Accepted    one active backup per VM, oldest first; the location is
//	            Available; tracker, plan, temporary volume and
//	            VirtualMachineBackup; when KubeVirt has written the files:
//	            Prepared
//	Prepared    the temporary volume moves from its claim in the VM's
//	            namespace to one in the DataUpload's (Velero's), where the
//	            upload pod is created; once it runs: InProgress
//	InProgress  the pod succeeded: Completed, else Failed
//
// The upload pod runs in Velero's namespace, as Velero's exposers run
// theirs, beside the location's credentials secret, which it mounts: the
// credentials never enter the VM's namespace. spec.cancel moves a live
// upload through Canceling to Canceled, and spec.operationTimeout (counted
// from creation) to Failed; every end deletes the temporary volume and its
// claims, the VirtualMachineBackup and the pod. The tracker stays: it holds
// KubeVirt's checkpoint for the next incremental.
type DataUploadReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Reader reads from the API server what is not cached: VMs, claims,
	// secrets.
	Reader   client.Reader
	Recorder record.EventRecorder
	Config   Config
	Now      func() time.Time
	// Metrics counts the uploads that end; nil counts nothing.
	Metrics *Metrics
	// openRepository opens a location's repository for the controller's
	// own reads; nil opens its bucket. Tests replace it.
	openRepository func(*location) (*backup.Repository, error)
}

func (r *DataUploadReconciler) open(l *location) (*backup.Repository, error) {
	if r.openRepository != nil {
		return r.openRepository(l)
	}
	return l.open()
}

// uploadJob is a DataUpload and the names of what it creates.
type uploadJob struct {
	du     *velerov2.DataUpload
	vm     catalog.VM
	backup string
	// name is used for the temporary volume's claim and the
	// VirtualMachineBackup in the VM's namespace, and for the volume's
	// claim and the pod in the DataUpload's.
	name string
}

// moverKey names the upload pod and the claim it mounts.
func (j *uploadJob) moverKey() client.ObjectKey {
	return client.ObjectKey{Namespace: j.du.Namespace, Name: j.name}
}

func (j *uploadJob) moverMeta() metav1.ObjectMeta {
	m := j.meta()
	m.Namespace = j.du.Namespace
	return m
}

func (j *uploadJob) meta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: j.name, Namespace: j.vm.Namespace,
		Labels: ownerLabels(KindDataUpload, j.du.UID), Annotations: ownerAnnotations(j.du.Namespace, j.du.Name)}
}

func (j *uploadJob) key() client.ObjectKey {
	return client.ObjectKey{Namespace: j.vm.Namespace, Name: j.name}
}

// UploadTarget is what a DataUpload of this data mover stores, as the
// controller reads it: the backup's name in the store (which its snapshot
// ID starts with) and the VM. The delete action reads a DataUpload the same
// way.
func UploadTarget(du *velerov2.DataUpload) (backupName string, vm catalog.VM, err error) {
	vm, err = vmOf(du)
	if err != nil {
		return "", catalog.VM{}, err
	}
	return backupNameOf(du), vm, nil
}

// vmOf reads the VM a DataUpload is for.
func vmOf(du *velerov2.DataUpload) (catalog.VM, error) {
	name := du.Annotations[AnnotationVMName]
	ns := du.Annotations[AnnotationVMNamespace]
	if ns == "" {
		ns = du.Spec.SourceNamespace
	}
	if name == "" || ns == "" {
		return catalog.VM{}, fmt.Errorf("DataUpload names no VirtualMachine: annotation %s (and %s or spec.sourceNamespace) required",
			AnnotationVMName, AnnotationVMNamespace)
	}
	return catalog.VM{Namespace: ns, Name: name}, nil
}

func isOurUpload(o client.Object) bool {
	du, ok := o.(*velerov2.DataUpload)
	return ok && du.Spec.DataMover == DataMover
}

func uploadDone(p velerov2.DataUploadPhase) bool {
	return p == velerov2.DataUploadPhaseCompleted || p == velerov2.DataUploadPhaseFailed || p == velerov2.DataUploadPhaseCanceled
}

// vmIndexValue is the VM a DataUpload of this data mover backs up.
func vmIndexValue(o client.Object) []string {
	du, ok := o.(*velerov2.DataUpload)
	if !ok || du.Spec.DataMover != DataMover {
		return nil
	}
	vm, err := vmOf(du)
	if err != nil {
		return nil
	}
	return []string{vm.String()}
}

// SetupWithManager registers the controller, its index and watches.
func (r *DataUploadReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.Config.defaults()
	if r.Now == nil {
		r.Now = time.Now
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &velerov2.DataUpload{}, indexVM, vmIndexValue); err != nil {
		return fmt.Errorf("index DataUploads by VM: %w", err)
	}
	err := ctrl.NewControllerManagedBy(mgr).Named("kubevirt-dataupload").
		For(&velerov2.DataUpload{}, builder.WithPredicates(predicate.NewPredicateFuncs(isOurUpload))).
		Watches(&velerov2.DataUpload{}, handler.EnqueueRequestsFromMapFunc(r.siblings)).
		Watches(&velerov1.BackupStorageLocation{}, handler.EnqueueRequestsFromMapFunc(r.usersOfLocation)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(ownerRequests(KindDataUpload))).
		Watches(kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK), handler.EnqueueRequestsFromMapFunc(ownerRequests(KindDataUpload))).
		Watches(&kubevirtv1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(r.uploadsOfInstance)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.slotWaiters)).
		Watches(kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK), handler.EnqueueRequestsFromMapFunc(r.slotWaiters)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("set up the DataUpload controller: %w", err)
	}
	return nil
}

// siblings wakes the other live DataUploads of a VM when one changes, so the
// next in line starts when the active one ends.
func (r *DataUploadReconciler) siblings(ctx context.Context, o client.Object) []reconcile.Request {
	du, ok := o.(*velerov2.DataUpload)
	if !ok || du.Spec.DataMover != DataMover {
		return nil
	}
	vm, err := vmOf(du)
	if err != nil {
		return nil
	}
	return r.liveUploads(ctx, func(s *velerov2.DataUpload) bool { return s.Name != du.Name },
		client.InNamespace(du.Namespace), client.MatchingFields{indexVM: vm.String()})
}

// uploadsOfInstance wakes the live DataUploads of a VM when its instance
// changes: one that stops fails the backup at once.
func (r *DataUploadReconciler) uploadsOfInstance(ctx context.Context, o client.Object) []reconcile.Request {
	vm := catalog.VM{Namespace: o.GetNamespace(), Name: o.GetName()}
	return r.liveUploads(ctx, func(*velerov2.DataUpload) bool { return true }, client.MatchingFields{indexVM: vm.String()})
}

// usersOfLocation wakes the live DataUploads of a location when it changes.
func (r *DataUploadReconciler) usersOfLocation(ctx context.Context, o client.Object) []reconcile.Request {
	return r.liveUploads(ctx, func(du *velerov2.DataUpload) bool {
		return du.Spec.DataMover == DataMover && du.Spec.BackupStorageLocation == o.GetName()
	}, client.InNamespace(o.GetNamespace()))
}

// liveUploads are the requests of the DataUploads listed with opts that
// have not ended and that wake selects.
func (r *DataUploadReconciler) liveUploads(ctx context.Context, wake func(*velerov2.DataUpload) bool, opts ...client.ListOption) []reconcile.Request {
	list := &velerov2.DataUploadList{}
	if err := r.Client.List(ctx, list, opts...); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		du := &list.Items[i]
		if !uploadDone(du.Status.Phase) && wake(du) {
			reqs = append(reqs, reconcile.Request{NamespacedName: nn(du.Namespace, du.Name)})
		}
	}
	return reqs
}

// Reconcile moves one DataUpload on.
func (r *DataUploadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	du := &velerov2.DataUpload{}
	if err := r.Client.Get(ctx, req.NamespacedName, du); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if du.Spec.DataMover != DataMover {
		return ctrl.Result{}, nil
	}
	vm, err := vmOf(du)
	if err != nil {
		if uploadDone(du.Status.Phase) {
			return ctrl.Result{}, nil
		}
		op := r.op(du)
		return ctrl.Result{}, op.setStatus(ctx, corev1.EventTypeWarning, "Failed", err.Error(), func() { op.end(velerov2.DataUploadPhaseFailed) })
	}
	j := &uploadJob{du: du, vm: vm, backup: backupNameOf(du), name: childName("kubevirt-backup", du.Name)}
	op := r.op(du, j.temporaries()...)
	op.release = func(ctx context.Context) error {
		return releaseVolume(ctx, r.Client, r.Reader, KindDataUpload, du.UID, client.ObjectKey{})
	}
	if uploadDone(du.Status.Phase) {
		return ctrl.Result{}, op.cleanup(ctx)
	}
	if du.Spec.Cancel || du.Status.Phase == velerov2.DataUploadPhaseCanceling {
		return op.cancel(ctx)
	}
	end, timeout := deadline(du.CreationTimestamp, du.Spec.OperationTimeout, r.Config.DefaultTimeout)
	left := end.Sub(r.Now())
	if left <= 0 {
		return op.fail(ctx, fmt.Sprintf("timed out after %s in phase %s", timeout, phaseName(du.Status.Phase)))
	}

	switch du.Status.Phase {
	case "", velerov2.DataUploadPhaseNew:
		err = r.accept(ctx, j)
	case velerov2.DataUploadPhaseAccepted:
		err = r.prepare(ctx, j)
	case velerov2.DataUploadPhasePrepared, velerov2.DataUploadPhaseInProgress:
		err = r.upload(ctx, j)
	}
	return op.result(ctx, err, left)
}

func backupNameOf(du *velerov2.DataUpload) string {
	if b := du.Labels[LabelBackupName]; b != "" {
		return b
	}
	if b := du.Annotations[AnnotationBackupName]; b != "" {
		return b
	}
	return du.Name
}

// accept takes a DataUpload whose VM runs.
func (r *DataUploadReconciler) accept(ctx context.Context, j *uploadJob) error {
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: j.vm.Namespace, Name: j.vm.Name}, vm); err != nil {
		if apierrors.IsNotFound(err) {
			return fatal("VirtualMachine %s not found", j.vm)
		}
		return fmt.Errorf("get VirtualMachine %s: %w", j.vm, err)
	}
	if vm.Status.PrintableStatus != kubevirtv1.VirtualMachineStatusRunning {
		return fatal("VirtualMachine %s is %s: only a running VM can be backed up", j.vm, printable(vm))
	}
	if err := changedBlockTracking(vm); err != nil {
		return err
	}
	msg := fmt.Sprintf("accepted backup %s of VirtualMachine %s", j.backup, j.vm)
	return r.setStatus(ctx, j.du, corev1.EventTypeNormal, "Accepted", msg, func(s *velerov2.DataUploadStatus) {
		s.Phase = velerov2.DataUploadPhaseAccepted
		s.AcceptedByNode = r.Config.Identity
		s.AcceptedTimestamp = r.now()
	})
}

// changedBlockTracking fails, or waits, unless KubeVirt tracks the VM's
// changed blocks: it backs up no other VM, and would keep the backup
// Initializing for good.
func changedBlockTracking(vm *kubevirtv1.VirtualMachine) error {
	var state kubevirtv1.ChangedBlockTrackingState
	if vm.Status.ChangedBlockTracking != nil {
		state = vm.Status.ChangedBlockTracking.State
	}
	switch state {
	case kubevirtv1.ChangedBlockTrackingEnabled:
		return nil
	case kubevirtv1.ChangedBlockTrackingInitializing:
		return waitFor("WaitingForChangedBlockTracking", 0, "waiting for KubeVirt to track the changed blocks of VirtualMachine %s/%s", vm.Namespace, vm.Name)
	case kubevirtv1.ChangedBlockTrackingPendingRestart:
		return fatal("VirtualMachine %s/%s must restart before KubeVirt tracks its changed blocks (its changedBlockTracking is PendingRestart)", vm.Namespace, vm.Name)
	}
	if state == "" {
		state = "unset"
	}
	return fatal("KubeVirt does not track the changed blocks of VirtualMachine %s/%s (its changedBlockTracking is %s): "+
		"turn on the IncrementalBackup and UtilityVolumes gates and select the VM in changedBlockTrackingLabelSelectors", vm.Namespace, vm.Name, state)
}

func printable(vm *kubevirtv1.VirtualMachine) string {
	if vm.Status.PrintableStatus == "" {
		return "not running"
	}
	return string(vm.Status.PrintableStatus)
}

// prepare waits its turn and the location, has KubeVirt write the backup
// onto the temporary volume, and waits for it.
func (r *DataUploadReconciler) prepare(ctx context.Context, j *uploadJob) error {
	if ahead, err := r.aheadInLine(ctx, j); err != nil {
		return err
	} else if ahead != "" {
		return waitFor("WaitingForVM", 0, "waiting for DataUpload %s of the same VirtualMachine %s", ahead, j.vm)
	}
	bsl, err := availableLocation(ctx, r.Client, r.Reader, j.du.Namespace, j.du.Spec.BackupStorageLocation, r.Config.PollInterval)
	if err != nil {
		return err
	}
	u := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK)
	if err := getLatest(ctx, r.Client, r.Reader, j.key(), u); apierrors.IsNotFound(err) {
		if wait, err := r.backupSlot(ctx, j); err != nil {
			return err
		} else if wait != "" {
			return waitFor("WaitingForBackupSlot", r.Config.PollInterval, "%s", wait)
		}
		return r.startBackup(ctx, j, bsl)
	} else if err != nil {
		return fmt.Errorf("get VirtualMachineBackup %s: %w", j.key(), err)
	}
	vmb := &kubevirtbackup.VMBackup{}
	if err := kubevirtbackup.FromUnstructured(u, vmb); err != nil {
		return err
	}
	if failed, msg := vmb.Failed(); failed {
		if strings.Contains(msg, "No space left on device") {
			msg += r.tooSmall(ctx, j)
		}
		return fatal("VirtualMachineBackup %s failed: %s", j.key(), msg)
	}
	if !vmb.Succeeded() {
		stage := ""
		if st := vmb.Stage(); st != "" {
			stage = " (" + st + ")"
		}
		if err := r.instanceRuns(ctx, j, types.UID(vmb.Annotations[AnnotationInstance]), stage); err != nil {
			return err
		}
		return waitFor("WaitingForVMBackup", r.Config.PollInterval, "waiting for VirtualMachineBackup %s%s", j.key(), stage)
	}
	if vmb.Status.CheckpointName == "" {
		return fatal("VirtualMachineBackup %s completed without a checkpoint name", j.key())
	}
	msg := fmt.Sprintf("KubeVirt wrote %s checkpoint %s", strings.ToLower(vmb.Status.Type), vmb.Status.CheckpointName)
	return r.setStatus(ctx, j.du, corev1.EventTypeNormal, "Prepared", msg, func(s *velerov2.DataUploadStatus) {
		s.Phase = velerov2.DataUploadPhasePrepared
	})
}

// tooSmall says which volume a backup filled and how to give the next one
// more room: KubeVirt neither checks nor grows it.
func (r *DataUploadReconciler) tooSmall(ctx context.Context, j *uploadJob) string {
	size := "its size unknown"
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Reader.Get(ctx, j.key(), pvc); err == nil {
		if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
			size = q.String()
		}
	}
	return fmt.Sprintf(": the backup's volume (claim %s, %s) is too small; set annotation %s on VirtualMachine %s to a larger size",
		j.key(), size, AnnotationBackupPVCSize, j.vm)
}

// instanceRuns fails the backup when the VM's instance it is of stopped,
// or was replaced, before KubeVirt ended it: KubeVirt fails a backup it
// began, but one it has not begun waits for an instance without end.
func (r *DataUploadReconciler) instanceRuns(ctx context.Context, j *uploadJob, uid types.UID, stage string) error {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: j.vm.Namespace, Name: j.vm.Name}, vmi)
	stopped := "VirtualMachine %s stopped before its VirtualMachineBackup %s ended"
	switch {
	case apierrors.IsNotFound(err):
		return fatal(stopped+"%s", j.vm, j.key(), stage)
	case err != nil:
		return fmt.Errorf("get VirtualMachineInstance %s: %w", j.vm, err)
	case uid != "" && vmi.UID != uid:
		return fatal(stopped+": it runs again as another instance%s", j.vm, j.key(), stage)
	case vmi.DeletionTimestamp != nil:
		return fatal(stopped+": its instance is being deleted%s", j.vm, j.key(), stage)
	case vmi.Status.Phase != kubevirtv1.Running:
		return fatal(stopped+": its instance is in phase %q%s", j.vm, j.key(), vmi.Status.Phase, stage)
	}
	return nil
}

// aheadInLine names the oldest live DataUpload of the same VM created before
// this one: backups of one VM run one at a time, oldest first.
func (r *DataUploadReconciler) aheadInLine(ctx context.Context, j *uploadJob) (string, error) {
	list := &velerov2.DataUploadList{}
	if err := r.Client.List(ctx, list, client.InNamespace(j.du.Namespace), client.MatchingFields{indexVM: j.vm.String()}); err != nil {
		return "", fmt.Errorf("list DataUploads of %s: %w", j.vm, err)
	}
	var first *velerov2.DataUpload
	for i := range list.Items {
		o := &list.Items[i]
		if o.Name == j.du.Name || uploadDone(o.Status.Phase) || !olderUpload(o, j.du) {
			continue
		}
		if first == nil || olderUpload(o, first) {
			first = o
		}
	}
	if first == nil {
		return "", nil
	}
	return first.Name, nil
}

// startBackup keeps the VM's tracker, plans full or incremental against the
// store, and creates the temporary volume and the VirtualMachineBackup.
func (r *DataUploadReconciler) startBackup(ctx context.Context, j *uploadJob, bsl *velerov1.BackupStorageLocation) error {
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: j.vm.Namespace, Name: j.vm.Name}, vm); err != nil {
		if apierrors.IsNotFound(err) {
			return fatal("VirtualMachine %s not found", j.vm)
		}
		return fmt.Errorf("get VirtualMachine %s: %w", j.vm, err)
	}
	disks, err := vmDisks(ctx, r.Reader, vm)
	if err != nil {
		return err
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: j.vm.Namespace, Name: j.vm.Name}, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return fatal("VirtualMachine %s stopped before its backup began", j.vm)
		}
		return fmt.Errorf("get VirtualMachineInstance %s: %w", j.vm, err)
	}
	tracker, err := r.ensureTracker(ctx, j)
	if err != nil {
		return err
	}
	loc, err := usableLocation(ctx, r.Reader, bsl, r.Config.PollInterval)
	if err != nil {
		return err
	}
	repo, err := r.open(loc)
	if err != nil {
		return fatal("%w", err)
	}
	opts, err := r.planOptions(j, tracker)
	if err != nil {
		return fatal("%w", err)
	}
	plan, err := repo.Plan(ctx, j.vm, opts)
	if err != nil {
		return waitFor("BackupStorageLocationUnavailable", r.Config.PollInterval, "waiting: plan the backup of %s: %v", j.vm, err)
	}
	size := backupVolumeSize(disks)
	if s := j.du.Annotations[AnnotationBackupPVCSize]; s != "" {
		if size, err = resource.ParseQuantity(s); err != nil {
			return fatal("annotation %s: %w", AnnotationBackupPVCSize, err)
		}
	}
	if err := r.createClaim(ctx, j, size); err != nil {
		return err
	}
	if err := r.createVMBackup(ctx, j, vmi.UID, tracker, plan, disks); err != nil {
		return err
	}
	if plan.Type == catalog.Full {
		r.Recorder.Eventf(j.du, corev1.EventTypeNormal, "BackupStarted", "full backup of %s into %s (%s): %s", j.vm, j.name, size.String(), plan.Reason)
	} else {
		r.Recorder.Eventf(j.du, corev1.EventTypeNormal, "BackupStarted", "incremental backup of %s from checkpoint %s into %s (%s)", j.vm, plan.Parent, j.name, size.String())
	}
	return waitFor("WaitingForVMBackup", 0, "waiting for VirtualMachineBackup %s", j.key())
}

func (r *DataUploadReconciler) planOptions(j *uploadJob, tracker *kubevirtbackup.VMBackupTracker) (backup.PlanOptions, error) {
	opts := backup.PlanOptions{
		ForceFull:             ForceFull(j.du.Annotations),
		MaxChainLength:        r.Config.MaxChainLength,
		HypervisorCheckpoints: []string{},
	}
	if c := tracker.LatestCheckpoint(); c != "" {
		opts.HypervisorCheckpoints = []string{c}
	}
	if v, ok := j.du.Spec.DataMoverConfig[ConfigMaxChainLength]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return opts, fmt.Errorf("spec.dataMoverConfig.%s: %q is not a count", ConfigMaxChainLength, v)
		}
		opts.MaxChainLength = n
	}
	return opts, nil
}

// ensureTracker returns the VM's tracker, creating it when it is missing and
// replacing one that tracks something else. A new tracker knows no
// checkpoint, so the next backup is full.
func (r *DataUploadReconciler) ensureTracker(ctx context.Context, j *uploadJob) (*kubevirtbackup.VMBackupTracker, error) {
	key := client.ObjectKey{Namespace: j.vm.Namespace, Name: trackerName(j.vm.Name)}
	u := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupTrackerGVK)
	err := getLatest(ctx, r.Client, r.Reader, key, u)
	if err == nil {
		t := &kubevirtbackup.VMBackupTracker{}
		if err := kubevirtbackup.FromUnstructured(u, t); err != nil {
			return nil, err
		}
		src := t.Spec.Source
		if src.Kind == "VirtualMachine" && src.Name == j.vm.Name && src.APIGroup != nil && *src.APIGroup == kubevirtv1.SchemeGroupVersion.Group {
			return t, nil
		}
		if err := deleteIfPresent(ctx, r.Client, u); err != nil {
			return nil, err
		}
		r.Recorder.Eventf(j.du, corev1.EventTypeWarning, "TrackerReplaced", "VirtualMachineBackupTracker %s tracked %s %s; replacing it", key, src.Kind, src.Name)
		return nil, waitFor("TrackerReplaced", time.Second, "waiting for VirtualMachineBackupTracker %s to be replaced", key)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get VirtualMachineBackupTracker %s: %w", key, err)
	}
	group := kubevirtv1.SchemeGroupVersion.Group
	t := &kubevirtbackup.VMBackupTracker{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{LabelVM: j.vm.Name}},
		Spec:       kubevirtbackup.VMBackupTrackerSpec{Source: corev1.TypedLocalObjectReference{APIGroup: &group, Kind: "VirtualMachine", Name: j.vm.Name}},
	}
	u, err = kubevirtbackup.ToUnstructured(t, kubevirtbackup.VMBackupTrackerGVK)
	if err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, apiFailure(err, "create VirtualMachineBackupTracker %s", key)
	}
	r.Recorder.Eventf(j.du, corev1.EventTypeNormal, "TrackerCreated", "created VirtualMachineBackupTracker %s: the backup is full", key)
	return t, nil
}

func (r *DataUploadReconciler) createClaim(ctx context.Context, j *uploadJob, size resource.Quantity) error {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: j.meta(),
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	sc := r.Config.StorageClass
	if v := j.du.Spec.DataMoverConfig[ConfigStorageClass]; v != "" {
		sc = v
	}
	if sc != "" {
		pvc.Spec.StorageClassName = &sc
	}
	if err := r.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFailure(err, "create temporary volume %s", j.key())
	}
	return nil
}

func (r *DataUploadReconciler) createVMBackup(ctx context.Context, j *uploadJob, instance types.UID, tracker *kubevirtbackup.VMBackupTracker, plan *backup.Plan, disks []vmDisk) error {
	meta := j.meta()
	meta.Annotations[AnnotationInstance] = string(instance)
	meta.Annotations[AnnotationPlanType] = string(plan.Type)
	meta.Annotations[AnnotationPlanParent] = plan.Parent
	meta.Annotations[AnnotationPlanReason] = plan.Reason
	meta.Annotations[AnnotationDisks] = formatDisks(disks)
	group := "backup.kubevirt.io"
	vmb := &kubevirtbackup.VMBackup{
		ObjectMeta: meta,
		Spec: kubevirtbackup.VMBackupSpec{
			Source:          corev1.TypedLocalObjectReference{APIGroup: &group, Kind: kubevirtbackup.VMBackupTrackerGVK.Kind, Name: tracker.Name},
			Mode:            kubevirtbackup.BackupModePush,
			PVCName:         j.name,
			ForceFullBackup: plan.Type == catalog.Full,
		},
	}
	u, err := kubevirtbackup.ToUnstructured(vmb, kubevirtbackup.VMBackupGVK)
	if err != nil {
		return err
	}
	if err := r.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFailure(err, "create VirtualMachineBackup %s", j.key())
	}
	return nil
}

func formatDisks(disks []vmDisk) string {
	parts := make([]string, len(disks))
	for i, d := range disks {
		parts[i] = d.Volume + "=" + d.Name + ":" + d.Size.String()
	}
	return strings.Join(parts, ",")
}

func parseDisks(s string) ([]mover.Disk, map[string]string, error) {
	var disks []mover.Disk
	sizes := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		volume, rest, ok := strings.Cut(p, "=")
		name, size, _ := strings.Cut(rest, ":")
		if !ok || volume == "" || name == "" {
			return nil, nil, fmt.Errorf("annotation %s: %q: want <volume>=<claim>:<size>", AnnotationDisks, p)
		}
		disks = append(disks, mover.Disk{Volume: volume, Name: name})
		if size != "" {
			sizes[name] = size
		}
	}
	return disks, sizes, nil
}

// upload runs the upload pod and finishes with its result.
func (r *DataUploadReconciler) upload(ctx context.Context, j *uploadJob) error {
	u := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK)
	if err := getLatest(ctx, r.Client, r.Reader, j.key(), u); err != nil {
		if apierrors.IsNotFound(err) {
			return fatal("VirtualMachineBackup %s disappeared", j.key())
		}
		return fmt.Errorf("get VirtualMachineBackup %s: %w", j.key(), err)
	}
	pod := &corev1.Pod{}
	if err := getLatest(ctx, r.Client, r.Reader, j.moverKey(), pod); apierrors.IsNotFound(err) {
		if j.du.Status.Phase == velerov2.DataUploadPhaseInProgress {
			return fatal("upload pod %s disappeared", j.moverKey())
		}
		if wait, err := r.uploadSlot(ctx, j); err != nil {
			return err
		} else if wait != "" {
			return waitFor("WaitingForUploadSlot", r.Config.PollInterval, "%s", wait)
		}
		return r.startUpload(ctx, j, u)
	} else if err != nil {
		return fmt.Errorf("get upload pod %s: %w", j.moverKey(), err)
	}
	finished, succeeded, message := podOutcome(pod)
	switch {
	case !finished:
		if pod.Status.Phase == corev1.PodRunning && j.du.Status.Phase == velerov2.DataUploadPhasePrepared {
			return r.setStatus(ctx, j.du, corev1.EventTypeNormal, "UploadStarted", fmt.Sprintf("upload pod %s is running", j.moverKey()),
				func(s *velerov2.DataUploadStatus) {
					s.Phase = velerov2.DataUploadPhaseInProgress
					s.StartTimestamp = r.now()
					s.Node = pod.Spec.NodeName
				})
		}
		return nil
	case !succeeded:
		return fatal("upload pod %s failed: %s", j.moverKey(), firstLine(message))
	}
	res, err := mover.DecodeUploadResult(message)
	if err != nil {
		return fatal("%w", err)
	}
	return r.complete(ctx, j, u, res)
}

func (r *DataUploadReconciler) startUpload(ctx context.Context, j *uploadJob, u *unstructured.Unstructured) error {
	vmb := &kubevirtbackup.VMBackup{}
	if err := kubevirtbackup.FromUnstructured(u, vmb); err != nil {
		return err
	}
	opts, err := r.uploadOptions(ctx, j, vmb, u)
	if err != nil {
		return err
	}
	bsl, err := availableLocation(ctx, r.Client, r.Reader, j.du.Namespace, j.du.Spec.BackupStorageLocation, r.Config.PollInterval)
	if err != nil {
		return err
	}
	loc, err := usableLocation(ctx, r.Reader, bsl, r.Config.PollInterval)
	if err != nil {
		return err
	}
	opts.BSL = loc.manifest
	move := &volumeMove{client: r.Client, reader: r.Reader, kind: KindDataUpload, uid: j.du.UID,
		owner: j.du.Namespace + "/" + j.du.Name, from: j.key(), to: j.moverKey(), newClaim: j.moverClaim}
	volume, err := move.run(ctx)
	if err != nil {
		return err
	}
	pod := r.Config.uploadPod(j.moverMeta(), loc, j.name, opts.Args(), opts.Env())
	if err := r.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return apiFailure(err, "create upload pod %s", j.moverKey())
	}
	r.Recorder.Eventf(j.du, corev1.EventTypeNormal, "UploadPodCreated", "upload pod %s created for %s checkpoint %s on volume %s",
		j.moverKey(), opts.Type, opts.Checkpoint, volume)
	return nil
}

// moverClaim binds the temporary volume in the DataUpload's namespace, as
// a claim there names it: its class, modes and capacity.
func (j *uploadJob) moverClaim(pv *corev1.PersistentVolume) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: j.moverMeta(), Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      pv.Spec.AccessModes,
		StorageClassName: ptr.To(pv.Spec.StorageClassName),
		VolumeMode:       pv.Spec.VolumeMode,
		VolumeName:       pv.Name,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceStorage: pv.Spec.Capacity[corev1.ResourceStorage]}},
	}}
}

// uploadOptions tells the pod what KubeVirt wrote. A backup KubeVirt took
// full where an incremental was planned is uploaded as full.
func (r *DataUploadReconciler) uploadOptions(ctx context.Context, j *uploadJob, vmb *kubevirtbackup.VMBackup, u *unstructured.Unstructured) (mover.UploadOptions, error) {
	disks, sizes, err := parseDisks(vmb.Annotations[AnnotationDisks])
	if err != nil {
		return mover.UploadOptions{}, fatal("VirtualMachineBackup %s: %w", j.key(), err)
	}
	if included := vmb.Status.IncludedVolumes; len(included) > 0 {
		want := map[string]bool{}
		for _, v := range included {
			want[v.VolumeName] = true
		}
		var kept []mover.Disk
		for _, d := range disks {
			if want[d.Volume] {
				kept = append(kept, d)
				delete(want, d.Volume)
			}
		}
		for v := range want {
			kept = append(kept, mover.Disk{Volume: v, Name: v})
		}
		sort.Slice(kept, func(a, b int) bool { return kept[a].Volume < kept[b].Volume })
		disks = kept
	}
	opts := mover.UploadOptions{
		VM: j.vm, Backup: j.backup, Checkpoint: vmb.Status.CheckpointName, VMBackup: vmb.Name,
		Source: PodBackupDir, Disks: disks, DiskSizes: sizes, Credentials: credentialsFile(),
		Progress: mover.ObjectRef{Namespace: j.du.Namespace, Name: j.du.Name},
	}
	planned := catalog.CheckpointType(vmb.Annotations[AnnotationPlanType])
	switch vmb.Status.Type {
	case kubevirtbackup.BackupTypeFull:
		opts.Type = catalog.Full
		if planned == catalog.Incremental {
			r.Recorder.Eventf(j.du, corev1.EventTypeWarning, "FullInsteadOfIncremental",
				"KubeVirt took a full backup where an incremental from %s was planned", vmb.Annotations[AnnotationPlanParent])
		}
	case kubevirtbackup.BackupTypeIncremental:
		if planned != catalog.Incremental {
			return opts, fatal("VirtualMachineBackup %s is incremental where a full backup was asked for", j.key())
		}
		opts.Type, opts.Parent = catalog.Incremental, vmb.Annotations[AnnotationPlanParent]
	default:
		return opts, fatal("VirtualMachineBackup %s reports backup type %q", j.key(), vmb.Status.Type)
	}
	if opts.VMBackupJSON, err = archiveJSON(u); err != nil {
		return opts, err
	}
	t := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupTrackerGVK)
	if err := getLatest(ctx, r.Client, r.Reader, client.ObjectKey{Namespace: j.vm.Namespace, Name: vmb.Spec.Source.Name}, t); err == nil {
		if opts.TrackerJSON, err = archiveJSON(t); err != nil {
			return opts, err
		}
	} else if !apierrors.IsNotFound(err) {
		return opts, fmt.Errorf("get VirtualMachineBackupTracker %s: %w", vmb.Spec.Source.Name, err)
	}
	return opts, nil
}

// archiveJSON renders an object for the store without its server-side
// bookkeeping.
func archiveJSON(u *unstructured.Unstructured) ([]byte, error) {
	c := u.DeepCopy()
	c.SetManagedFields(nil)
	c.SetResourceVersion("")
	data, err := json.Marshal(c.Object)
	if err != nil {
		return nil, fmt.Errorf("archive %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return data, nil
}

func (r *DataUploadReconciler) complete(ctx context.Context, j *uploadJob, vmb *unstructured.Unstructured, res *mover.UploadResult) error {
	result := map[string]string{
		ResultCheckpoint: res.Checkpoint,
		ResultType:       string(res.Type),
		ResultBytes:      strconv.FormatInt(res.Bytes, 10),
	}
	if res.Parent != "" {
		result[ResultParent] = res.Parent
	}
	if reason := vmb.GetAnnotations()[AnnotationPlanReason]; reason != "" && res.Type == catalog.Full {
		result[ResultFullReason] = reason
	}
	msg := fmt.Sprintf("%s checkpoint %s of %s stored for backup %s: %d bytes uploaded", res.Type, res.Checkpoint, j.vm, j.backup, res.Bytes)
	op := r.op(j.du, j.temporaries()...)
	if err := op.setStatus(ctx, corev1.EventTypeNormal, "Completed", msg, func() {
		op.end(velerov2.DataUploadPhaseCompleted)
		s := &j.du.Status
		s.SnapshotID = SnapshotID(j.backup, j.vm.Namespace, j.vm.Name)
		s.Path = res.Path
		s.DataMoverResult = &result
		s.Progress.TotalBytes, s.Progress.BytesDone = res.Bytes, res.Bytes
	}); err != nil {
		return err
	}
	return op.cleanup(ctx)
}

// temporaries are what a DataUpload creates and its end deletes: in
// Velero's namespace the pod and the claim it mounts, in the VM's the
// VirtualMachineBackup and the claim KubeVirt wrote to.
func (j *uploadJob) temporaries() []client.Object {
	inVM := metav1.ObjectMeta{Name: j.name, Namespace: j.vm.Namespace}
	inVelero := metav1.ObjectMeta{Name: j.name, Namespace: j.du.Namespace}
	vmb := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK)
	vmb.SetName(j.name)
	vmb.SetNamespace(j.vm.Namespace)
	return []client.Object{&corev1.Pod{ObjectMeta: inVelero}, &corev1.PersistentVolumeClaim{ObjectMeta: inVelero}, vmb,
		&corev1.PersistentVolumeClaim{ObjectMeta: inVM}}
}

func (r *DataUploadReconciler) op(du *velerov2.DataUpload, temporaries ...client.Object) *operation[velerov2.DataUploadPhase] {
	s := &du.Status
	return &operation[velerov2.DataUploadPhase]{kind: "DataUpload", obj: du, phase: &s.Phase, message: &s.Message,
		start: &s.StartTimestamp, completion: &s.CompletionTimestamp, temporaries: temporaries,
		client: r.Client, recorder: r.Recorder, now: r.Now, metrics: r.Metrics}
}

func (r *DataUploadReconciler) setStatus(ctx context.Context, du *velerov2.DataUpload, eventType, reason, msg string, change func(*velerov2.DataUploadStatus)) error {
	return r.op(du).setStatus(ctx, eventType, reason, msg, func() { change(&du.Status) })
}

func (r *DataUploadReconciler) now() *metav1.Time {
	t := metav1.NewTime(r.Now())
	return &t
}
