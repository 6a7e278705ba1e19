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
	"fmt"
	"path/filepath"
	"sync/atomic"
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
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

const diskSize = 64 << 20

var specCounter atomic.Int32

// testVM is a running VirtualMachine with one claim-backed disk whose
// content a backuptest.Hypervisor holds.
type testVM struct {
	namespace, name string
	claim           string
	hv              *backuptest.Hypervisor
}

func (v *testVM) catalogVM() catalog.VM { return catalog.VM{Namespace: v.namespace, Name: v.name} }

// newVM makes a namespace of its own with a running VM and its instance,
// known to the KubeVirt stand-in, its changed blocks tracked.
func newVM(ctx context.Context) *testVM {
	n := specCounter.Add(1)
	v := &testVM{namespace: fmt.Sprintf("vms-%d", n), name: "db", claim: "db-rootdisk"}
	Expect(k8s.Create(ctx, restrictedNamespace(v.namespace))).To(Succeed())
	Expect(k8s.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: v.claim, Namespace: v.namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(diskSize, resource.BinarySI)}},
		},
	})).To(Succeed())
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: v.name, Namespace: v.namespace},
		Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: []kubevirtv1.Volume{{
				Name: standInVolume,
				VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.claim}}},
			}}},
		}},
	}
	Expect(k8s.Create(ctx, vm)).To(Succeed())
	vm.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusRunning
	vm.Status.ChangedBlockTracking = &kubevirtv1.ChangedBlockTrackingStatus{State: kubevirtv1.ChangedBlockTrackingEnabled}
	Expect(k8s.Status().Update(ctx, vm)).To(Succeed())
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: v.name, Namespace: v.namespace}}
	Expect(k8s.Create(ctx, vmi)).To(Succeed())
	vmi.Status.Phase = kubevirtv1.Running
	Expect(k8s.Status().Update(ctx, vmi)).To(Succeed())

	hv, err := backuptest.New(ctx, GinkgoT().TempDir(), diskSize)
	Expect(err).NotTo(HaveOccurred())
	Expect(hv.Write(ctx, 0, 4<<20, 0x11)).To(Succeed())
	kubevirt.add(v.namespace, v.name, hv)
	v.hv = hv
	return v
}

// restrictedNamespace is a namespace whose pods the API server's Pod
// Security admission holds to the "restricted" level: every pod the
// controllers make in the suite passes the real admission.
func restrictedNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce":         "restricted",
		"pod-security.kubernetes.io/enforce-version": "latest",
	}}}
}

// location is a backup storage location on its own bucket.
type location struct {
	name string
	cfg  objectstore.Config
}

func (l *location) repository() *backup.Repository {
	repo, err := backup.Open(l.cfg)
	Expect(err).NotTo(HaveOccurred())
	return repo
}

// newLocation creates a location on the suite's S3 server in the given
// phase ("" for none yet).
func newLocation(ctx context.Context, phase velerov1.BackupStorageLocationPhase) *location {
	return newLocationOn(ctx, s3, phase, s3.CACert)
}

// newLocationOn creates a location on srv whose spec.objectStorage.caCert
// is caCert.
func newLocationOn(ctx context.Context, srv *s3server.Server, phase velerov1.BackupStorageLocationPhase, caCert []byte) *location {
	n := specCounter.Add(1)
	l := &location{name: fmt.Sprintf("bsl-%d", n)}
	creds, err := srv.WriteCredentials(GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	l.cfg = srv.Config(fmt.Sprintf("bucket-%d", n), "cluster", creds)
	store, err := objectstore.NewS3(l.cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(store.CreateBucket(ctx)).To(Succeed())
	bsl := &velerov1.BackupStorageLocation{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: veleroNamespace},
		Spec: velerov1.BackupStorageLocationSpec{
			Provider: "aws",
			StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{
				Bucket: l.cfg.Bucket, Prefix: l.cfg.Prefix, CACert: caCert}},
			Config: map[string]string{"region": "us-east-1", "s3Url": srv.URL, "s3ForcePathStyle": "true"},
			Credential: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: credentialsName}, Key: "cloud"},
		},
	}
	Expect(k8s.Create(ctx, bsl)).To(Succeed())
	if phase != "" {
		setLocationPhase(ctx, l, phase)
	}
	return l
}

func setLocationPhase(ctx context.Context, l *location, phase velerov1.BackupStorageLocationPhase) {
	bsl := &velerov1.BackupStorageLocation{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: veleroNamespace, Name: l.name}, bsl)).To(Succeed())
	bsl.Status.Phase = phase
	Expect(k8s.Update(ctx, bsl)).To(Succeed())
}

// newDataUpload asks for a backup of vm as Velero's backup item action would.
func newDataUpload(ctx context.Context, vm *testVM, l *location, backupName string, change ...func(*velerov2.DataUpload)) *velerov2.DataUpload {
	du := &velerov2.DataUpload{
		ObjectMeta: metav1.ObjectMeta{
			Name: backupName + "-" + vm.namespace, Namespace: veleroNamespace,
			Labels:      map[string]string{datamover.LabelBackupName: backupName},
			Annotations: map[string]string{datamover.AnnotationVMName: vm.name, datamover.AnnotationVMNamespace: vm.namespace},
		},
		Spec: velerov2.DataUploadSpec{
			SnapshotType:          velerov2.SnapshotTypeCSI,
			SourcePVC:             vm.claim,
			DataMover:             datamover.DataMover,
			BackupStorageLocation: l.name,
			SourceNamespace:       vm.namespace,
			OperationTimeout:      metav1.Duration{Duration: 10 * time.Minute},
		},
	}
	for _, c := range change {
		c(du)
	}
	Expect(k8s.Create(ctx, du)).To(Succeed())
	return du
}

func getDataUpload(ctx context.Context, du *velerov2.DataUpload) *velerov2.DataUpload {
	out := &velerov2.DataUpload{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(du), out)).To(Succeed())
	return out
}

func dataUploadPhase(ctx context.Context, du *velerov2.DataUpload) func() velerov2.DataUploadPhase {
	return func() velerov2.DataUploadPhase { return getDataUpload(ctx, du).Status.Phase }
}

func dataUploadMessage(ctx context.Context, du *velerov2.DataUpload) func() string {
	return func() string { return getDataUpload(ctx, du).Status.Message }
}

func updateDataUpload(ctx context.Context, du *velerov2.DataUpload, change func(*velerov2.DataUpload)) {
	Eventually(func() error {
		cur := getDataUpload(ctx, du)
		change(cur)
		return k8s.Update(ctx, cur)
	}).Should(Succeed())
}

// temporaryName is the name of what the controller makes for a DataUpload.
func temporaryName(du *velerov2.DataUpload) string { return "kubevirt-backup-" + du.Name }

func vmBackupOf(du *velerov2.DataUpload) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kubevirtbackup.VMBackupGVK)
	u.SetNamespace(du.Spec.SourceNamespace)
	u.SetName(temporaryName(du))
	return u
}

// gone reports an object deleted, or being deleted (a claim keeps its
// protection finalizer without a controller manager to remove it).
func gone(ctx context.Context, obj client.Object) func() bool {
	return func() bool {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true
		}
		Expect(err).NotTo(HaveOccurred())
		return obj.GetDeletionTimestamp() != nil
	}
}

// expectTemporariesGone checks that the claims (in the VM's namespace and
// in Velero's), the VirtualMachineBackup, the pod and the volume of a
// DataUpload went away, and that no credentials ever were in the VM's
// namespace.
func expectTemporariesGone(ctx context.Context, du *velerov2.DataUpload) {
	inVM := metav1.ObjectMeta{Namespace: du.Spec.SourceNamespace, Name: temporaryName(du)}
	inVelero := metav1.ObjectMeta{Namespace: veleroNamespace, Name: temporaryName(du)}
	for _, obj := range []client.Object{
		&corev1.PersistentVolumeClaim{ObjectMeta: inVM}, vmBackupOf(du),
		&corev1.Pod{ObjectMeta: inVelero}, &corev1.PersistentVolumeClaim{ObjectMeta: inVelero},
	} {
		Eventually(gone(ctx, obj)).Should(BeTrue(), "%T %s/%s", obj, obj.GetNamespace(), obj.GetName())
	}
	Eventually(func() []corev1.PersistentVolume {
		list := &corev1.PersistentVolumeList{}
		Expect(k8s.List(ctx, list, client.MatchingLabels{datamover.LabelOwnerUID: string(du.UID)})).To(Succeed())
		return list.Items
	}).Should(BeEmpty(), "no volume held")
	expectNoCredentials(ctx, du.Spec.SourceNamespace)
}

// expectNoCredentials checks that a VM's namespace holds no secret: the
// location's credentials stay in Velero's namespace.
func expectNoCredentials(ctx context.Context, namespace string) {
	secrets := &corev1.SecretList{}
	Expect(k8s.List(ctx, secrets, client.InNamespace(namespace))).To(Succeed())
	Expect(secrets.Items).To(BeEmpty(), "secrets in %s", namespace)
}

// eventReasons lists the reasons of the events about an object.
func eventReasons(ctx context.Context, obj client.Object) func() []string {
	return func() []string {
		events := &corev1.EventList{}
		Expect(k8s.List(ctx, events, client.InNamespace(obj.GetNamespace()))).To(Succeed())
		var reasons []string
		for _, e := range events.Items {
			if e.InvolvedObject.Name == obj.GetName() {
				reasons = append(reasons, e.Reason)
			}
		}
		return reasons
	}
}

func resourceQuantity(bytes int64) resource.Quantity {
	return *resource.NewQuantity(bytes, resource.BinarySI)
}

// newDataDownload asks for a restore as Velero's restore item action would.
func newDataDownload(ctx context.Context, snapshotID, namespace, claim string, l *location, config map[string]string, change ...func(*velerov2.DataDownload)) *velerov2.DataDownload {
	dd := &velerov2.DataDownload{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("restore-%d", specCounter.Add(1)), Namespace: veleroNamespace},
		Spec: velerov2.DataDownloadSpec{
			TargetVolume:          velerov2.TargetVolumeSpec{PVC: claim, Namespace: namespace},
			BackupStorageLocation: l.name,
			DataMover:             datamover.DataMover,
			SnapshotID:            snapshotID,
			SourceNamespace:       namespace,
			DataMoverConfig:       config,
			OperationTimeout:      metav1.Duration{Duration: 10 * time.Minute},
		},
	}
	for _, c := range change {
		c(dd)
	}
	Expect(k8s.Create(ctx, dd)).To(Succeed())
	return dd
}

func getDataDownload(ctx context.Context, dd *velerov2.DataDownload) *velerov2.DataDownload {
	out := &velerov2.DataDownload{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(dd), out)).To(Succeed())
	return out
}

func dataDownloadPhase(ctx context.Context, dd *velerov2.DataDownload) func() velerov2.DataDownloadPhase {
	return func() velerov2.DataDownloadPhase { return getDataDownload(ctx, dd).Status.Phase }
}

// restoreClaim creates a claim as Velero's restore leaves it for a data
// mover (its CSI PVC restore action): no volume named, and a selector on
// velero.io/dynamic-pv-restore that no provisioner serves, so that only the
// volume the data mover binds to it can satisfy it.
func restoreClaim(ctx context.Context, namespace, name string, mode corev1.PersistentVolumeMode) {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  &mode,
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resourceQuantity(diskSize)}},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{
				velerov1.DynamicPVRestoreLabel: fmt.Sprintf("%s.%s.r%d", namespace, name, specCounter.Add(1))}},
		},
	}
	Expect(k8s.Create(ctx, pvc)).To(Succeed())
}

// expectRestoredInto checks that a DataDownload left claim namespace/name
// bound to a volume of its own holding the disk image whose SHA-256 is
// want, with the volume's own reclaim policy and no trace of the move,
// and nothing behind in Velero's namespace.
func expectRestoredInto(ctx context.Context, dd *velerov2.DataDownload, namespace, name, want string) {
	pvc := &corev1.PersistentVolumeClaim{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pvc)).To(Succeed())
	Expect(pvc.Status.Phase).To(Equal(corev1.ClaimBound))
	pv := &corev1.PersistentVolume{}
	Expect(k8s.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv)).To(Succeed())
	Expect(pv.Status.Phase).To(Equal(corev1.VolumeBound))
	Expect(pv.Spec.ClaimRef).NotTo(BeNil())
	Expect([]string{pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name, string(pv.Spec.ClaimRef.UID)}).To(Equal([]string{namespace, name, string(pvc.UID)}))
	Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimDelete), "the volume's own reclaim policy")
	Expect(pv.Labels).NotTo(HaveKey(datamover.LabelOwnerUID))
	Expect(pv.Annotations).NotTo(HaveKey(datamover.AnnotationReclaimPolicy))
	for k, v := range pvc.Spec.Selector.MatchLabels {
		Expect(pv.Labels).To(HaveKeyWithValue(k, v), "the volume matches the claim's selector")
	}
	dir, err := vols.claimDir(ctx, k8s, namespace, name)
	Expect(err).NotTo(HaveOccurred())
	Expect(testenv.SHA256(filepath.Join(dir, datamover.PodTargetFile))).To(Equal(want))
	meta := metav1.ObjectMeta{Namespace: veleroNamespace, Name: "kubevirt-restore-" + dd.Name}
	for _, obj := range []client.Object{&corev1.Pod{ObjectMeta: meta}, &corev1.PersistentVolumeClaim{ObjectMeta: meta}} {
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(MatchError(ContainSubstring("not found")), "%T %s", obj, meta.Name)
	}
}
