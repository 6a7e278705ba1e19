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
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
)

// The objects the DataUpload nightly-db creates in the VM's namespace and
// the DataDownload restore-db in Velero's.
const (
	uploadChild   = "kubevirt-backup-nightly-db"
	downloadChild = "kubevirt-restore-restore-db"
)

// step is one reconcile: what it starts from and what it must leave.
type step struct {
	objs    []client.Object // besides world()
	removes []client.Object // of world(), by kind and name
	after   time.Duration   // since creation; a minute when zero

	phase   string
	message string // a regular expression
	event   string // the last event's type and reason; none when empty
	result  ctrl.Result
	// creates names objects in prod that must exist afterwards.
	creates []client.Object
	// cleaned: the temporary objects are gone and the owner is marked
	// cleaned up; otherwise it is not marked.
	cleaned bool
	// then checks more of what the reconcile left.
	then func(*stepper)
	// unseen are kinds of objs the controller's cache has not seen yet:
	// its cached client finds none of them, its API reader does.
	unseen []client.Object
	// ends is the end the metrics counted, if any, at location (when
	// not "default"); bytes and transfer are the bytes and the transfer
	// time counted with it.
	ends     string
	location string
	bytes    int64
	transfer time.Duration
}

// stepper reconciles one DataUpload or DataDownload with a fake API
// server, a fake clock and a store in memory.
type stepper struct {
	ctx      context.Context
	c        client.Client
	clock    *testingclock.FakePassiveClock
	recorder *record.FakeRecorder
	store    *objectstoretest.Memory
	registry *prometheus.Registry
	metrics  *Metrics
}

func newStepper(s step, owner client.Object) *stepper {
	after := s.after
	if after == 0 {
		after = time.Minute
	}
	// An object of s replaces the world's of the same kind and name, or
	// removes it.
	var objs []client.Object
	for _, o := range world() {
		replaced := false
		for _, n := range slices.Concat(s.objs, s.removes) {
			replaced = replaced || sameKind(o, n) && client.ObjectKeyFromObject(o) == client.ObjectKeyFromObject(n)
		}
		if !replaced {
			objs = append(objs, o)
		}
	}
	registry := prometheus.NewRegistry()
	metrics, err := NewMetrics(registry, nil)
	Expect(err).NotTo(HaveOccurred())
	return &stepper{ctx: context.Background(), c: fakeAPI(nil, append(append(objs, s.objs...), owner)...),
		clock: testingclock.NewFakePassiveClock(created.Add(after)), recorder: record.NewFakeRecorder(100),
		store: objectstoretest.NewMemory(), registry: registry, metrics: metrics}
}

// cached is the controller's cached client: the API server's objects but
// those of kinds unseen.
func (t *stepper) cached(unseen []client.Object) client.Client {
	if len(unseen) == 0 {
		return t.c
	}
	return staleCache{Client: t.c, unseen: unseen}
}

// staleCache is a cache whose watches of some kinds lag behind the API
// server: their objects are not found yet.
type staleCache struct {
	client.Client
	unseen []client.Object
}

func (c staleCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	for _, kind := range c.unseen {
		if sameKind(kind, obj) {
			return apierrors.NewNotFound(schema.GroupResource{Resource: fmt.Sprintf("%T", obj)}, key.Name)
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (t *stepper) repository(*location) (*backup.Repository, error) {
	return backup.NewRepository(t.store), nil
}

func (t *stepper) exists(o client.Object) bool {
	err := t.c.Get(t.ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object))
	if apierrors.IsNotFound(err) {
		return false
	}
	Expect(err).NotTo(HaveOccurred())
	return true
}

func (t *stepper) lastEvent() string {
	last := ""
	for len(t.recorder.Events) > 0 {
		last = <-t.recorder.Events
	}
	return last
}

// check compares what the reconcile left with s; owner is read back,
// before is as it was.
func (t *stepper) check(s step, res ctrl.Result, err error, before, owner client.Object, phase, message string, temporaries []client.Object) {
	Expect(err).NotTo(HaveOccurred())
	Expect(res).To(Equal(s.result))
	Expect(phase).To(Equal(s.phase))
	Expect(message).To(MatchRegexp(s.message))
	if s.event == "" {
		Expect(t.lastEvent()).To(BeEmpty())
	} else {
		Expect(t.lastEvent()).To(HavePrefix(s.event + " "))
	}
	for _, o := range s.creates {
		Expect(t.exists(o)).To(BeTrue(), "%T %s", o, o.GetName())
	}
	if s.cleaned {
		for _, o := range temporaries {
			Expect(t.exists(o)).To(BeFalse(), "%T %s", o, o.GetName())
		}
		Expect(owner.GetAnnotations()).To(HaveKeyWithValue(AnnotationCleanedUp, "true"))
	} else {
		Expect(owner.GetAnnotations()[AnnotationCleanedUp]).To(Equal(before.GetAnnotations()[AnnotationCleanedUp]))
	}
	if s.then != nil {
		s.then(t)
	}
}

func inProd(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: "prod"} }

func inVelero(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "velero"}
}

// moverPod is an upload pod in phase, in Velero's namespace; a finished one
// carries message as its termination message.
func moverPod(name string, phase corev1.PodPhase, message string) *corev1.Pod {
	return moverPodIn(inVelero(name), phase, message)
}

// restorePod is the restore pod of restore-db.
func restorePod(phase corev1.PodPhase, message string) *corev1.Pod {
	return moverPodIn(inVelero(downloadChild), phase, message)
}

func moverPodIn(meta metav1.ObjectMeta, phase corev1.PodPhase, message string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: phase}}
	if message != "" {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: PodContainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: message}}}}
	}
	return p
}

// vmBackup is the VirtualMachineBackup of nightly-db as KubeVirt reports it.
func vmBackup(status *kubevirtbackup.VMBackupStatus) client.Object {
	meta := inProd(uploadChild)
	meta.Annotations = map[string]string{AnnotationDisks: "rootdisk=db-root:1Gi", AnnotationPlanType: string(catalog.Full), AnnotationInstance: "vmi-uid"}
	vmb := &kubevirtbackup.VMBackup{ObjectMeta: meta, Status: status,
		Spec: kubevirtbackup.VMBackupSpec{Source: corev1.TypedLocalObjectReference{Kind: kubevirtbackup.VMBackupTrackerGVK.Kind, Name: trackerName("db")}}}
	u, err := kubevirtbackup.ToUnstructured(vmb, kubevirtbackup.VMBackupGVK)
	Expect(err).NotTo(HaveOccurred())
	return u
}

func vmBackupIs(condition, message, checkpoint string) *kubevirtbackup.VMBackupStatus {
	return &kubevirtbackup.VMBackupStatus{Type: kubevirtbackup.BackupTypeFull, CheckpointName: checkpoint,
		Conditions: []metav1.Condition{{Type: condition, Status: metav1.ConditionTrue, Message: message}}}
}

// vmBackupDone is the status KubeVirt v1.8 ends a backup with: Done, the
// outcome in the reason.
func vmBackupDone(reason, checkpoint string) *kubevirtbackup.VMBackupStatus {
	return &kubevirtbackup.VMBackupStatus{Type: kubevirtbackup.BackupTypeFull, CheckpointName: checkpoint,
		Conditions: []metav1.Condition{{Type: kubevirtbackup.ConditionDone, Status: metav1.ConditionTrue, Reason: reason}}}
}

// uploadTemporaries are what a DataUpload creates and its end deletes.
func uploadTemporaries() []client.Object {
	return []client.Object{moverPod(uploadChild, corev1.PodRunning, ""), vmBackup(nil),
		&corev1.PersistentVolumeClaim{ObjectMeta: inProd(uploadChild)}, &corev1.PersistentVolumeClaim{ObjectMeta: inVelero(uploadChild)}}
}

// backupVolume is the temporary volume KubeVirt wrote, bound to its claim
// in the VM's namespace.
func backupVolume(change ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	return testVolume("pvc-backup", corev1.ObjectReference{Namespace: "prod", Name: uploadChild, UID: "backup-claim-uid"}, change...)
}

var heldByUpload = heldBy(KindDataUpload, "du-uid")

// boundInVelero makes the volume bound to the upload pod's claim.
func boundInVelero(pv *corev1.PersistentVolume) {
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "velero", Name: uploadChild, UID: "mover-claim-uid"}
}

// claimOf is a claim bound to volume pvc-backup.
func claimOf(meta metav1.ObjectMeta, uid types.UID) *corev1.PersistentVolumeClaim {
	meta.UID = uid
	return &corev1.PersistentVolumeClaim{ObjectMeta: meta, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-backup"},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
}

// downloadTemporaries are what a DataDownload creates and its end deletes:
// the restore pod and the intermediate claim, bound.
func downloadTemporaries() []client.Object {
	return []client.Object{restorePod(corev1.PodRunning, ""), intermediateClaimOf("pvc-restore")}
}

// intermediateClaimOf is restore-db's claim in Velero's namespace bound to
// volume.
func intermediateClaimOf(volume string) *corev1.PersistentVolumeClaim {
	meta := inVelero(downloadChild)
	meta.UID = "intermediate-uid"
	return &corev1.PersistentVolumeClaim{ObjectMeta: meta, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
}

// testVolume is a provisioned volume bound to claim.
func testVolume(name string, claim corev1.ObjectReference, change ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: "fast",
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}, ClaimRef: &claim},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	for _, c := range change {
		c(pv)
	}
	return pv
}

// restoredVolume is the volume the restore pod wrote, bound to the
// intermediate claim as the provisioner left it.
func restoredVolume(change ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	return testVolume("pvc-restore", corev1.ObjectReference{Namespace: "velero", Name: downloadChild, UID: "intermediate-uid"}, change...)
}

// heldBy makes a volume held by a DataUpload or DataDownload while it
// moves it.
func heldBy(kind string, uid types.UID) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		for k, v := range ownerLabels(kind, uid) {
			pv.Labels[k] = v
		}
		pv.Annotations[AnnotationReclaimPolicy] = string(pv.Spec.PersistentVolumeReclaimPolicy)
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	}
}

var heldByDownload = heldBy(KindDataDownload, "dd-uid")

// boundTo makes a volume bound to the user's claim db-root.
func boundTo(pv *corev1.PersistentVolume) {
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "prod", Name: "db-root", UID: "user-uid"}
}

// userClaim is the claim db-root bound to volume, as the PV controller
// leaves it.
func userClaim(volume string) *corev1.PersistentVolumeClaim {
	meta := inProd("db-root")
	meta.UID = "user-uid"
	return &corev1.PersistentVolumeClaim{ObjectMeta: meta, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volume},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
}

// haltedVM is VM prod/db as the restore item action restores it.
func haltedVM() *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod",
		Annotations: map[string]string{AnnotationOriginalRunStrategy: "Always", AnnotationOriginalRunStrategySource: "runStrategy"}},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted)}}
}

// ofOperation makes a DataDownload one of the restore operation dd-op's,
// for VM db as restored.
func ofOperation(dd *velerov2.DataDownload) {
	dd.Labels = map[string]string{velerov1.AsyncOperationIDLabel: "dd-op"}
	dd.Annotations = map[string]string{AnnotationTargetVMName: "db"}
}

// resultKept is restore-db once the restore pod's result is kept, 45 s
// after its creation, the pod's last progress report the whole size.
func resultKept(dd *velerov2.DataDownload) {
	dd.Annotations = map[string]string{AnnotationRestoreResult: `{"chain":["cp-1"],"bytes":42}`,
		AnnotationRestoreFinished: created.Add(45 * time.Second).UTC().Format(time.RFC3339)}
	dd.Status.Progress.TotalBytes, dd.Status.Progress.BytesDone = 42, 42
}

func (t *stepper) volume() *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{}
	Expect(t.c.Get(t.ctx, client.ObjectKey{Name: "pvc-restore"}, pv)).To(Succeed())
	return pv
}

func (t *stepper) vm() *kubevirtv1.VirtualMachine {
	vm := &kubevirtv1.VirtualMachine{}
	Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "prod", Name: "db"}, vm)).To(Succeed())
	return vm
}

// newUpload is the DataUpload of backup nightly of VM prod/db in phase.
func newUpload(phase velerov2.DataUploadPhase) *velerov2.DataUpload {
	return &velerov2.DataUpload{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly-db", Namespace: "velero", UID: "du-uid", CreationTimestamp: metav1.NewTime(created),
			Labels:      map[string]string{LabelBackupName: "nightly"},
			Annotations: map[string]string{AnnotationVMName: "db", AnnotationVMNamespace: "prod"}},
		Spec:   velerov2.DataUploadSpec{DataMover: DataMover, BackupStorageLocation: "default", SourceNamespace: "prod", SourcePVC: "db-root"},
		Status: velerov2.DataUploadStatus{Phase: phase},
	}
}

func newDownload(phase velerov2.DataDownloadPhase) *velerov2.DataDownload {
	return &velerov2.DataDownload{
		ObjectMeta: metav1.ObjectMeta{Name: "restore-db", Namespace: "velero", UID: "dd-uid", CreationTimestamp: metav1.NewTime(created)},
		Spec: velerov2.DataDownloadSpec{DataMover: DataMover, BackupStorageLocation: "default", SourceNamespace: "prod",
			SnapshotID: SnapshotID("nightly", "prod", "db"), TargetVolume: velerov2.TargetVolumeSpec{PVC: "db-root", Namespace: "prod"}},
		Status: velerov2.DataDownloadStatus{Phase: phase},
	}
}

// cbtVM is the running VM prod/db with KubeVirt's changed block tracking
// in state.
func cbtVM(state kubevirtv1.ChangedBlockTrackingState) *kubevirtv1.VirtualMachine {
	return &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"},
		Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusRunning,
			ChangedBlockTracking: &kubevirtv1.ChangedBlockTrackingStatus{State: state}}}
}

func with[T any](o T, change func(T)) T {
	change(o)
	return o
}

// left is the time an operation created a minute ago has before the
// default timeout.
const left = 4*time.Hour - time.Minute

var _ = Describe("the DataUpload state machine", func() {
	DescribeTable("moves one step per reconcile",
		func(du *velerov2.DataUpload, s step) {
			t := newStepper(s, du)
			r := &DataUploadReconciler{Client: t.cached(s.unseen), Reader: t.c, Recorder: t.recorder, Config: Config{Identity: "node-1"},
				Now: t.clock.Now, Metrics: t.metrics, openRepository: t.repository}
			r.Config.defaults()

			res, err := r.Reconcile(t.ctx, request(du))

			out := &velerov2.DataUpload{}
			Expect(t.c.Get(t.ctx, client.ObjectKeyFromObject(du), out)).To(Succeed())
			t.check(s, res, err, du, out, string(out.Status.Phase), out.Status.Message, uploadTemporaries())
			Expect(samples(t.registry)).To(Equal(counted(KindLabelDataUpload, s)))
			if s.event != "" && uploadDone(out.Status.Phase) {
				Expect(out.Status.StartTimestamp).NotTo(BeNil())
				Expect(out.Status.CompletionTimestamp.Time).To(BeTemporally("==", t.clock.Now()))
			}
		},
		Entry("New: a running VM is accepted", newUpload(""), step{
			phase: "Accepted", message: "^accepted backup nightly of VirtualMachine prod/db$", event: "Normal Accepted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("New: a stopped VM fails it", newUpload(velerov2.DataUploadPhaseNew), step{
			objs: []client.Object{&kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"},
				Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusStopped}}},
			phase: "Failed", message: "^VirtualMachine prod/db is Stopped: only a running VM can be backed up$", event: "Warning Failed", ends: "Failed",
			cleaned: true}),
		Entry("New: a VM whose changed blocks KubeVirt does not track fails it", newUpload(""), step{
			objs:  []client.Object{cbtVM("")},
			phase: "Failed", message: "^KubeVirt does not track the changed blocks of VirtualMachine prod/db \\(its changedBlockTracking is unset\\): turn on the IncrementalBackup",
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("New: a VM that must restart for changed block tracking fails it", newUpload(""), step{
			objs:  []client.Object{cbtVM(kubevirtv1.ChangedBlockTrackingPendingRestart)},
			phase: "Failed", message: "^VirtualMachine prod/db must restart before KubeVirt tracks its changed blocks", event: "Warning Failed", ends: "Failed",
			cleaned: true}),
		Entry("New: changed block tracking being set up is waited for", newUpload(""), step{
			objs:  []client.Object{cbtVM(kubevirtv1.ChangedBlockTrackingInitializing)},
			phase: "", message: "^waiting for KubeVirt to track the changed blocks of VirtualMachine prod/db$", event: "Normal WaitingForChangedBlockTracking",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("New: no VM named fails it", with(newUpload(""), func(du *velerov2.DataUpload) { du.Annotations = nil; du.Spec.SourceNamespace = "" }), step{
			phase: "Failed", message: "^DataUpload names no VirtualMachine", event: "Warning Failed", ends: "Failed"}),
		Entry("Accepted: an older DataUpload of the VM goes first", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: []client.Object{with(newUpload(velerov2.DataUploadPhaseInProgress), func(du *velerov2.DataUpload) {
				du.Name, du.CreationTimestamp = "hourly-db", metav1.NewTime(created.Add(-time.Minute))
			})},
			phase: "Accepted", message: "^waiting for DataUpload hourly-db of the same VirtualMachine prod/db$", event: "Normal WaitingForVM",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Accepted: an unavailable location is waited for", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: []client.Object{&velerov1.BackupStorageLocation{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "velero"},
				Status: velerov1.BackupStorageLocationStatus{Phase: velerov1.BackupStorageLocationPhaseUnavailable, Message: "no route"}}},
			phase: "Accepted", message: "^waiting: backup storage location default is Unavailable: no route$",
			event: "Normal BackupStorageLocationUnavailable", result: ctrl.Result{RequeueAfter: 30 * time.Second}}),
		Entry("Accepted: a missing location fails it", with(newUpload(velerov2.DataUploadPhaseAccepted), func(du *velerov2.DataUpload) {
			du.Spec.BackupStorageLocation = "gone"
		}), step{phase: "Failed", message: "^backup storage location velero/gone not found$", event: "Warning Failed", ends: "Failed",
			location: "gone", cleaned: true}),
		Entry("Accepted: KubeVirt still writes", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  []client.Object{vmBackup(nil)},
			phase: "Accepted", message: "^waiting for VirtualMachineBackup prod/kubevirt-backup-nightly-db$", event: "Normal WaitingForVMBackup",
			result: ctrl.Result{RequeueAfter: 30 * time.Second}}),
		Entry("Accepted: the VM stopped before KubeVirt began fails it", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:    []client.Object{vmBackup(nil)},
			removes: []client.Object{&kubevirtv1.VirtualMachineInstance{ObjectMeta: inProd("db")}},
			phase:   "Failed", message: "^VirtualMachine prod/db stopped before its VirtualMachineBackup prod/kubevirt-backup-nightly-db ended$",
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: the VM running again as another instance fails it", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: []client.Object{vmBackup(nil), &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: "vmi-2"},
				Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}},
			phase: "Failed", message: `^VirtualMachine prod/db stopped before its VirtualMachineBackup prod/kubevirt-backup-nightly-db ended: it runs again as another instance$`,
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: the VM's instance failing before KubeVirt began fails it", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: []client.Object{vmBackup(nil), &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: "vmi-uid"},
				Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Failed}}},
			phase: "Failed", message: `^VirtualMachine prod/db stopped before its VirtualMachineBackup prod/kubevirt-backup-nightly-db ended: its instance is in phase "Failed"$`,
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: KubeVirt wrote the checkpoint", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1"))},
			phase: "Prepared", message: "^KubeVirt wrote full checkpoint cp-1$", event: "Normal Prepared",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Accepted: KubeVirt failed", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  append(uploadTemporaries()[:1], vmBackup(vmBackupIs(kubevirtbackup.ConditionFailed, "domain not running", ""))),
			phase: "Failed", message: "^VirtualMachineBackup prod/kubevirt-backup-nightly-db failed: domain not running$",
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: KubeVirt filling the backup's volume says which and what to do", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: append(uploadTemporaries()[:1], vmBackup(vmBackupIs(kubevirtbackup.ConditionFailed, "No space left on device", "")),
				&corev1.PersistentVolumeClaim{ObjectMeta: inProd(uploadChild),
					Status: corev1.PersistentVolumeClaimStatus{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("48Mi")}}}),
			phase: "Failed", message: `^VirtualMachineBackup prod/kubevirt-backup-nightly-db failed: No space left on device: the backup's volume ` +
				`\(claim prod/kubevirt-backup-nightly-db, 48Mi\) is too small; set annotation kubevirt-datamover.io/backup-pvc-size on VirtualMachine prod/db to a larger size$`,
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: a location not in the cache yet is read from the API server", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs: []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1"))}, unseen: []client.Object{&velerov1.BackupStorageLocation{}},
			phase: "Prepared", message: "^KubeVirt wrote full checkpoint cp-1$", event: "Normal Prepared",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Accepted: KubeVirt v1.8 wrote the checkpoint", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  []client.Object{vmBackup(vmBackupDone("Successfully completed VirtualMachineBackup", "cp-1"))},
			phase: "Prepared", message: "^KubeVirt wrote full checkpoint cp-1$", event: "Normal Prepared",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Accepted: KubeVirt v1.8 failed", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  append(uploadTemporaries()[:1], vmBackup(vmBackupDone("Backup has failed: VMI is not in a running state", ""))),
			phase: "Failed", message: "^VirtualMachineBackup prod/kubevirt-backup-nightly-db failed: VMI is not in a running state$",
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: KubeVirt named no checkpoint", newUpload(velerov2.DataUploadPhaseAccepted), step{
			objs:  []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", ""))},
			phase: "Failed", message: "completed without a checkpoint name$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Prepared: the backup's volume is held, its claim in the VM's namespace deleted", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs:  []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1")), claimOf(inProd(uploadChild), "backup-claim-uid"), backupVolume()},
			phase: "Prepared", message: "^waiting for claim prod/kubevirt-backup-nightly-db to be deleted$", event: "Normal WaitingForClaimDeletion",
			result: ctrl.Result{RequeueAfter: movePause},
			then: func(t *stepper) {
				pv := &corev1.PersistentVolume{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Name: "pvc-backup"}, pv)).To(Succeed())
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain))
				Expect(pv.Labels).To(HaveKeyWithValue(LabelOwnerUID, "du-uid"))
				Expect(t.exists(&corev1.PersistentVolumeClaim{ObjectMeta: inProd(uploadChild)})).To(BeFalse())
			}}),
		Entry("Prepared: the held volume is claimed in Velero's namespace", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs:  []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1")), backupVolume(heldByUpload)},
			phase: "Prepared", message: "^waiting for volume pvc-backup to bind to claim velero/kubevirt-backup-nightly-db$", event: "Normal WaitingForBinding",
			result: ctrl.Result{RequeueAfter: movePause},
			then: func(t *stepper) {
				claim := &corev1.PersistentVolumeClaim{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "velero", Name: uploadChild}, claim)).To(Succeed())
				Expect(claim.Spec.VolumeName).To(Equal("pvc-backup"))
				Expect(claim.Spec.StorageClassName).To(HaveValue(Equal("fast")))
				Expect(claim.Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("1Gi")))
				pv := &corev1.PersistentVolume{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Name: "pvc-backup"}, pv)).To(Succeed())
				Expect([]string{pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name}).To(Equal([]string{"velero", uploadChild}))
			}}),
		Entry("Prepared: with the volume bound in Velero's namespace, the upload pod is created there", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs: []client.Object{vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1")),
				backupVolume(heldByUpload, boundInVelero), claimOf(inVelero(uploadChild), "mover-claim-uid")},
			phase: "Prepared", event: "Normal UploadPodCreated", result: ctrl.Result{RequeueAfter: left},
			creates: []client.Object{&corev1.Pod{ObjectMeta: inVelero(uploadChild)}},
			then: func(t *stepper) {
				pod := &corev1.Pod{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "velero", Name: uploadChild}, pod)).To(Succeed())
				Expect(pod.Spec.Volumes).To(ContainElements(
					HaveField("VolumeSource.Secret.SecretName", defaultCredentialsSecret),
					HaveField("VolumeSource.PersistentVolumeClaim", HaveValue(Equal(corev1.PersistentVolumeClaimVolumeSource{ClaimName: uploadChild, ReadOnly: true})))))
				secrets := &corev1.SecretList{}
				Expect(t.c.List(t.ctx, secrets, client.InNamespace("prod"))).To(Succeed())
				Expect(secrets.Items).To(BeEmpty(), "no credentials in the VM's namespace")
				pv := &corev1.PersistentVolume{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Name: "pvc-backup"}, pv)).To(Succeed())
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete), "deleted with the pod's claim at the end")
			}}),
		Entry("Failed: a volume still held goes with its claims", newUpload(velerov2.DataUploadPhaseFailed), step{
			objs: append(uploadTemporaries(), backupVolume(heldByUpload)), phase: "Failed", cleaned: true,
			then: func(t *stepper) {
				pv := &corev1.PersistentVolume{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Name: "pvc-backup"}, pv)).To(Succeed())
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete))
				Expect(pv.Labels).NotTo(HaveKey(LabelOwnerUID))
			}}),
		Entry("Prepared: a pending pod changes nothing", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs:  []client.Object{vmBackup(nil), moverPod(uploadChild, corev1.PodPending, "")},
			phase: "Prepared", result: ctrl.Result{RequeueAfter: left}}),
		Entry("Prepared: the pod runs", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs:  []client.Object{vmBackup(nil), moverPod(uploadChild, corev1.PodRunning, "")},
			phase: "InProgress", message: "^upload pod velero/kubevirt-backup-nightly-db is running$", event: "Normal UploadStarted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Prepared: a pod and a VirtualMachineBackup not in the cache yet are read from the API server", newUpload(velerov2.DataUploadPhasePrepared), step{
			objs: []client.Object{vmBackup(nil), moverPod(uploadChild, corev1.PodRunning, "")}, unseen: []client.Object{&corev1.Pod{}, &unstructured.Unstructured{}},
			phase: "InProgress", message: "^upload pod velero/kubevirt-backup-nightly-db is running$", event: "Normal UploadStarted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("InProgress: a pod not in the cache yet is read from the API server", newUpload(velerov2.DataUploadPhaseInProgress), step{
			objs: []client.Object{vmBackup(nil), moverPod(uploadChild, corev1.PodRunning, "")}, unseen: []client.Object{&corev1.Pod{}},
			phase: "InProgress", result: ctrl.Result{RequeueAfter: left}}),
		Entry("InProgress: the pod succeeded", startedAt(newUpload(velerov2.DataUploadPhaseInProgress)), step{
			objs: append(uploadTemporaries()[1:], moverPod(uploadChild, corev1.PodSucceeded,
				`{"checkpoint":"cp-1","type":"full","bytes":42,"path":"checkpoints/prod/db/cp-1"}`)),
			phase: "Completed", message: "^full checkpoint cp-1 of prod/db stored for backup nightly: 42 bytes uploaded$",
			event: "Normal Completed", ends: "Completed", bytes: 42, transfer: 30 * time.Second, cleaned: true, result: ctrl.Result{RequeueAfter: left}}),
		Entry("InProgress: the pod failed", with(newUpload(velerov2.DataUploadPhaseInProgress), func(du *velerov2.DataUpload) {
			du.Status.Progress.BytesDone = 10
		}), step{
			objs:  append(uploadTemporaries()[1:], moverPod(uploadChild, corev1.PodFailed, "no space left on device\nat line 3")),
			phase: "Failed", message: "^upload pod velero/kubevirt-backup-nightly-db failed: no space left on device$",
			event: "Warning Failed", ends: "Failed", bytes: 10, cleaned: true}),
		Entry("InProgress: the pod disappeared", newUpload(velerov2.DataUploadPhaseInProgress), step{
			objs:  []client.Object{vmBackup(nil)},
			phase: "Failed", message: "^upload pod velero/kubevirt-backup-nightly-db disappeared$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("InProgress: the VirtualMachineBackup disappeared", newUpload(velerov2.DataUploadPhaseInProgress), step{
			phase: "Failed", message: "^VirtualMachineBackup prod/kubevirt-backup-nightly-db disappeared$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("InProgress: the operation timed out", with(newUpload(velerov2.DataUploadPhaseInProgress), func(du *velerov2.DataUpload) {
			du.Spec.OperationTimeout = metav1.Duration{Duration: time.Hour}
		}), step{
			objs: uploadTemporaries(), after: time.Hour,
			phase: "Failed", message: "^timed out after 1h0m0s in phase InProgress$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: a cancel goes through Canceling", with(newUpload(velerov2.DataUploadPhaseAccepted), func(du *velerov2.DataUpload) {
			du.Spec.Cancel = true
		}), step{
			objs:  uploadTemporaries(),
			phase: "Canceling", message: "^canceling$", event: "Normal Canceling", result: ctrl.Result{RequeueAfter: cancelingPause},
			creates: uploadTemporaries()}),
		Entry("Canceling: the temporary objects go", newUpload(velerov2.DataUploadPhaseCanceling), step{
			objs:  uploadTemporaries(),
			phase: "Canceled", message: "^canceled$", event: "Normal Canceled", ends: "Canceled", cleaned: true}),
		Entry("New: a cancel ends it at once", with(newUpload(""), func(du *velerov2.DataUpload) { du.Spec.Cancel = true }), step{
			phase: "Canceled", message: "^canceled$", event: "Normal Canceled", ends: "Canceled", cleaned: true}),
		Entry("Completed: the temporary objects go once", newUpload(velerov2.DataUploadPhaseCompleted), step{
			objs: uploadTemporaries(), phase: "Completed", cleaned: true}),
		Entry("Completed and cleaned up: nothing is deleted again", with(newUpload(velerov2.DataUploadPhaseCompleted), func(du *velerov2.DataUpload) {
			du.Annotations[AnnotationCleanedUp] = "true"
		}), step{objs: uploadTemporaries(), phase: "Completed", creates: uploadTemporaries()}),
	)

	It("leaves another data mover's DataUpload alone", func() {
		du := with(newUpload(""), func(du *velerov2.DataUpload) { du.Spec.DataMover = "velero" })
		t := newStepper(step{}, du)
		r := &DataUploadReconciler{Client: t.c, Reader: t.c, Recorder: t.recorder, Now: t.clock.Now}
		Expect(r.Reconcile(t.ctx, request(du))).To(Equal(ctrl.Result{}))
		Expect(t.lastEvent()).To(BeEmpty())
	})

	It("plans an incremental from a tracker its cache has not seen yet", func() {
		tracker, err := kubevirtbackup.ToUnstructured(&kubevirtbackup.VMBackupTracker{ObjectMeta: inProd(trackerName("db")),
			Spec: kubevirtbackup.VMBackupTrackerSpec{Source: corev1.TypedLocalObjectReference{
				APIGroup: ptr.To(kubevirtv1.SchemeGroupVersion.Group), Kind: "VirtualMachine", Name: "db"}},
			Status: &kubevirtbackup.VMBackupTrackerStatus{LatestCheckpoint: &kubevirtbackup.BackupCheckpoint{Name: "cp-1"}},
		}, kubevirtbackup.VMBackupTrackerGVK)
		Expect(err).NotTo(HaveOccurred())
		du := newUpload(velerov2.DataUploadPhaseAccepted)
		s := step{objs: []client.Object{tracker}, unseen: []client.Object{&unstructured.Unstructured{}}}
		t := newStepper(s, du)
		storeBackup(t.ctx, t)
		r := &DataUploadReconciler{Client: t.cached(s.unseen), Reader: t.c, Recorder: t.recorder, Now: t.clock.Now, openRepository: t.repository}
		r.Config.defaults()

		_, err = r.Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		vmb := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK)
		Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "prod", Name: uploadChild}, vmb)).To(Succeed())
		Expect(vmb.GetAnnotations()).To(HaveKeyWithValue(AnnotationPlanType, string(catalog.Incremental)))
		Expect(vmb.GetAnnotations()).To(HaveKeyWithValue(AnnotationPlanParent, "cp-1"))
	})
})

// storeBackup puts backup nightly of prod/db, one full checkpoint of disk
// db-root, in the store.
func storeBackup(ctx context.Context, t *stepper) {
	repo := backup.NewRepository(t.store)
	vm := catalog.VM{Namespace: "prod", Name: "db"}
	const disk = "checkpoints/prod/db/cp-1/cp-1-db-root.qcow2"
	_, err := t.store.Put(ctx, disk, strings.NewReader("disk"), 4, objectstore.PutOptions{})
	Expect(err).NotTo(HaveOccurred())
	_, err = repo.Catalog.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
		idx.Checkpoints = append(idx.Checkpoints, catalog.CheckpointEntry{ID: "cp-1", Type: catalog.Full,
			Files: []catalog.FileEntry{{DiskName: "db-root", ObjectPath: disk, Size: 4}}})
		return nil
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(repo.RecordBackup(ctx, "nightly", vm, []string{"cp-1"})).To(Succeed())
}

var _ = Describe("the DataDownload state machine", func() {
	DescribeTable("moves one step per reconcile",
		func(dd *velerov2.DataDownload, stored bool, s step) {
			t := newStepper(s, dd)
			if stored {
				storeBackup(t.ctx, t)
			}
			r := &DataDownloadReconciler{Client: t.cached(s.unseen), Reader: t.c, Recorder: t.recorder, Config: Config{Identity: "node-1"},
				Now: t.clock.Now, Metrics: t.metrics, openRepository: t.repository}
			r.Config.defaults()

			res, err := r.Reconcile(t.ctx, request(dd))

			out := &velerov2.DataDownload{}
			Expect(t.c.Get(t.ctx, client.ObjectKeyFromObject(dd), out)).To(Succeed())
			t.check(s, res, err, dd, out, string(out.Status.Phase), out.Status.Message, downloadTemporaries())
			Expect(samples(t.registry)).To(Equal(counted(KindLabelDataDownload, s)))
			if s.event != "" && downloadDone(out.Status.Phase) && !downloadDone(dd.Status.Phase) {
				Expect(out.Status.StartTimestamp).NotTo(BeNil())
				Expect(out.Status.CompletionTimestamp.Time).To(BeTemporally("==", t.clock.Now()))
			}
		},
		Entry("New: accepted", newDownload(""), false, step{
			phase: "Accepted", message: "^accepted restore of disk db-root of prod/db from backup nightly$", event: "Normal Accepted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("New: a snapshot ID of another data mover fails it", with(newDownload(""), func(dd *velerov2.DataDownload) {
			dd.Spec.SnapshotID = "f8b5c2a1"
		}), false, step{phase: "Failed", message: "want <backup>/<vm namespace>/<vm name>", event: "Warning Failed", ends: "Failed"}),
		Entry("Accepted: a missing target claim is waited for", with(newDownload(velerov2.DataDownloadPhaseAccepted), func(dd *velerov2.DataDownload) {
			dd.Spec.TargetVolume.PVC = "db-new"
		}), true, step{phase: "Accepted", message: "^waiting for target claim prod/db-new$", event: "Normal WaitingForTarget",
			result: ctrl.Result{RequeueAfter: 30 * time.Second}}),
		Entry("Accepted: the intermediate claim and the restore pod are created in Velero's namespace", newDownload(velerov2.DataDownloadPhaseAccepted), true, step{
			phase: "Prepared", message: "^restore pod velero/kubevirt-restore-restore-db writes disk db-root from a chain of 1 into a volume for claim prod/db-root$",
			event: "Normal Prepared", result: ctrl.Result{RequeueAfter: left}, creates: downloadTemporaries(),
			then: func(t *stepper) {
				claim := &corev1.PersistentVolumeClaim{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "velero", Name: downloadChild}, claim)).To(Succeed())
				Expect(claim.Spec.Resources.Requests).To(HaveKeyWithValue(corev1.ResourceStorage, resource.MustParse("1Gi")), "sized as the target claim")
				pod := &corev1.Pod{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "velero", Name: downloadChild}, pod)).To(Succeed())
				Expect(pod.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", defaultCredentialsSecret)),
					"the location's own secret, not a copy")
				Expect(t.exists(&corev1.Secret{ObjectMeta: inProd(downloadChild)})).To(BeFalse())
			}}),
		Entry("Accepted: a location not in the cache yet is read from the API server", newDownload(velerov2.DataDownloadPhaseAccepted), true, step{
			unseen: []client.Object{&velerov1.BackupStorageLocation{}},
			phase:  "Prepared", message: "^restore pod velero/kubevirt-restore-restore-db writes disk db-root from a chain of 1 into a volume for claim prod/db-root$",
			event: "Normal Prepared", result: ctrl.Result{RequeueAfter: left}, creates: downloadTemporaries()}),
		Entry("Accepted: a target claim bound already fails it, naming the claim", newDownload(velerov2.DataDownloadPhaseAccepted), true, step{
			objs:  []client.Object{userClaim("pvc-other")},
			phase: "Failed", message: "^target claim prod/db-root is already bound to volume pvc-other: ", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Accepted: the backup holds no such disk", with(newDownload(velerov2.DataDownloadPhaseAccepted), func(dd *velerov2.DataDownload) {
			dd.Spec.DataMoverConfig = map[string]string{ConfigDisk: "vdb"}
		}), true, step{phase: "Failed", message: "^backup nightly of prod/db holds no disk vdb \\(checkpoint cp-1\\)$",
			event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Prepared: the pod runs", newDownload(velerov2.DataDownloadPhasePrepared), false, step{
			objs:  []client.Object{restorePod(corev1.PodRunning, "")},
			phase: "InProgress", message: "^restore pod velero/kubevirt-restore-restore-db is running$", event: "Normal RestoreStarted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("Prepared: a pod not in the cache yet is read from the API server", newDownload(velerov2.DataDownloadPhasePrepared), false, step{
			objs: []client.Object{restorePod(corev1.PodRunning, "")}, unseen: []client.Object{&corev1.Pod{}},
			phase: "InProgress", message: "^restore pod velero/kubevirt-restore-restore-db is running$", event: "Normal RestoreStarted",
			result: ctrl.Result{RequeueAfter: left}}),
		Entry("InProgress: the pod succeeded: its result is kept, the volume held, pod and claim deleted", newDownload(velerov2.DataDownloadPhaseInProgress), false, step{
			objs:  []client.Object{restorePod(corev1.PodSucceeded, `{"chain":["cp-1"],"bytes":42}`), intermediateClaimOf("pvc-restore"), restoredVolume()},
			phase: "InProgress", message: "^waiting for claim velero/kubevirt-restore-restore-db to be deleted$", event: "Normal WaitingForClaimDeletion",
			result: ctrl.Result{RequeueAfter: movePause},
			then: func(t *stepper) {
				for _, o := range downloadTemporaries() {
					Expect(t.exists(o)).To(BeFalse(), "%T", o)
				}
				pv := t.volume()
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain))
				Expect(pv.Annotations).To(HaveKeyWithValue(AnnotationReclaimPolicy, "Delete"))
				Expect(pv.Labels).To(HaveKeyWithValue(LabelOwnerUID, "dd-uid"))
				dd := &velerov2.DataDownload{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "velero", Name: "restore-db"}, dd)).To(Succeed())
				Expect(dd.Annotations).To(HaveKeyWithValue(AnnotationRestoreResult, `{"chain":["cp-1"],"bytes":42}`))
				Expect(dd.Annotations).To(HaveKeyWithValue(AnnotationRestoreFinished, t.clock.Now().UTC().Format(time.RFC3339)))
			}}),
		Entry("InProgress: the held volume is offered to the target claim", with(newDownload(velerov2.DataDownloadPhaseInProgress), resultKept), false, step{
			objs: []client.Object{restoredVolume(heldByDownload), with(userClaim(""), func(c *corev1.PersistentVolumeClaim) {
				c.Status.Phase = corev1.ClaimPending
				c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"velero.io/dynamic-pv-restore": "prod.db-root.x7k2p"}}
			})},
			phase: "InProgress", message: "^waiting for volume pvc-restore to bind to claim prod/db-root$", event: "Normal WaitingForBinding",
			result: ctrl.Result{RequeueAfter: movePause},
			then: func(t *stepper) {
				claim := &corev1.PersistentVolumeClaim{}
				Expect(t.c.Get(t.ctx, client.ObjectKey{Namespace: "prod", Name: "db-root"}, claim)).To(Succeed())
				Expect(claim.Spec.VolumeName).To(Equal("pvc-restore"))
				pv := t.volume()
				Expect(pv.Spec.ClaimRef).To(Equal(&corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "prod", Name: "db-root"}))
				Expect(pv.Labels).To(HaveKeyWithValue("velero.io/dynamic-pv-restore", "prod.db-root.x7k2p"), "the volume matches the claim's selector")
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain))
			}}),
		Entry("InProgress: the volume bound to the target claim completes it", with(startedAt(newDownload(velerov2.DataDownloadPhaseInProgress)), resultKept), false, step{
			objs:  []client.Object{restoredVolume(heldByDownload, boundTo), userClaim("pvc-restore")},
			phase: "Completed", message: "^restored disk db-root of prod/db from backup nightly \\(chain of 1, 42 bytes\\) into claim prod/db-root \\(volume pvc-restore\\)$",
			event: "Normal Completed", ends: "Completed", bytes: 42, transfer: 15 * time.Second, cleaned: true, result: ctrl.Result{RequeueAfter: left},
			then: func(t *stepper) {
				pv := t.volume()
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete), "its own reclaim policy back")
				Expect(pv.Labels).NotTo(HaveKey(LabelOwnerUID))
				Expect(pv.Annotations).NotTo(HaveKey(AnnotationReclaimPolicy))
			}}),
		Entry("InProgress: a target claim bound to another volume meanwhile fails it, the volume to be deleted", with(newDownload(velerov2.DataDownloadPhaseInProgress), resultKept), false, step{
			objs:  []client.Object{restoredVolume(heldByDownload), userClaim("pvc-other")},
			phase: "Failed", message: "^claim prod/db-root is bound to volume pvc-other, not to volume pvc-restore$", event: "Warning Failed", ends: "Failed", bytes: 42, cleaned: true,
			then: func(t *stepper) {
				pv := t.volume()
				Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete))
				Expect(pv.Labels).NotTo(HaveKey(LabelOwnerUID))
			}}),
		Entry("InProgress: the pod failed", newDownload(velerov2.DataDownloadPhaseInProgress), false, step{
			objs:  append(downloadTemporaries()[1:], restorePod(corev1.PodFailed, "checksum mismatch")),
			phase: "Failed", message: "^restore pod velero/kubevirt-restore-restore-db failed: checksum mismatch$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("InProgress: the pod disappeared", newDownload(velerov2.DataDownloadPhaseInProgress), false, step{
			phase: "Failed", message: "^restore pod velero/kubevirt-restore-restore-db disappeared$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("InProgress: the operation timed out", newDownload(velerov2.DataDownloadPhaseInProgress), false, step{
			objs: downloadTemporaries(), after: 4 * time.Hour,
			phase: "Failed", message: "^timed out after 4h0m0s in phase InProgress$", event: "Warning Failed", ends: "Failed", cleaned: true}),
		Entry("Prepared: a cancel goes through Canceling", with(newDownload(velerov2.DataDownloadPhasePrepared), func(dd *velerov2.DataDownload) {
			dd.Spec.Cancel = true
		}), false, step{objs: downloadTemporaries(), phase: "Canceling", message: "^canceling$", event: "Normal Canceling",
			result: ctrl.Result{RequeueAfter: cancelingPause}, creates: downloadTemporaries()}),
		Entry("Canceling: the temporary objects go", newDownload(velerov2.DataDownloadPhaseCanceling), false, step{
			objs: downloadTemporaries(), phase: "Canceled", message: "^canceled$", event: "Normal Canceled", ends: "Canceled", cleaned: true}),
		Entry("Failed: the temporary objects go once", newDownload(velerov2.DataDownloadPhaseFailed), false, step{
			objs: downloadTemporaries(), phase: "Failed", cleaned: true}),
		Entry("Completed, the last of its operation: the VM gets its run strategy back", with(newDownload(velerov2.DataDownloadPhaseCompleted), ofOperation), false, step{
			objs: []client.Object{haltedVM(), with(newDownload(velerov2.DataDownloadPhaseCompleted), func(dd *velerov2.DataDownload) {
				ofOperation(dd)
				dd.Name, dd.Spec.TargetVolume.PVC = "restore-db-data", "db-data"
			})},
			phase: "Completed", event: "Normal VMResumed", cleaned: true,
			then: func(t *stepper) {
				vm := t.vm()
				Expect(vm.Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyAlways)))
				Expect(vm.Annotations).NotTo(HaveKey(AnnotationOriginalRunStrategy))
				Expect(vm.Annotations).NotTo(HaveKey(AnnotationOriginalRunStrategySource))
			}}),
		Entry("Completed, the last of its operation: a VM that used spec.running gets it back", with(newDownload(velerov2.DataDownloadPhaseCompleted), ofOperation), false, step{
			objs: []client.Object{with(haltedVM(), func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations[AnnotationOriginalRunStrategySource] = "running"
			})},
			phase: "Completed", event: "Normal VMResumed", cleaned: true,
			then: func(t *stepper) {
				vm := t.vm()
				Expect(vm.Spec.RunStrategy).To(BeNil())
				Expect(vm.Spec.Running).To(HaveValue(BeTrue()))
			}}),
		Entry("Completed while another disk of the VM is restored: the VM stays stopped", with(newDownload(velerov2.DataDownloadPhaseCompleted), ofOperation), false, step{
			objs: []client.Object{haltedVM(), with(newDownload(velerov2.DataDownloadPhaseInProgress), func(dd *velerov2.DataDownload) {
				ofOperation(dd)
				dd.Name, dd.Spec.TargetVolume.PVC = "restore-db-data", "db-data"
			})},
			phase: "Completed", cleaned: true,
			then: func(t *stepper) {
				Expect(t.vm().Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyHalted)))
				Expect(t.vm().Annotations).To(HaveKeyWithValue(AnnotationOriginalRunStrategy, "Always"))
			}}),
		Entry("Failed: the VM stays stopped", with(newDownload(velerov2.DataDownloadPhaseFailed), ofOperation), false, step{
			objs: []client.Object{haltedVM()}, phase: "Failed", cleaned: true,
			then: func(t *stepper) {
				Expect(t.vm().Spec.RunStrategy).To(HaveValue(Equal(kubevirtv1.RunStrategyHalted)))
			}}),
	)
})
