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
	"io"
	"reflect"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
)

// fault makes the API server answer one kind of request on one kind of
// object with an error, a number of times (negative: always).
type fault struct {
	verb  string // get, create or patch
	obj   client.Object
	err   error
	times int
	fired int
}

func (f *fault) hit(verb string, obj client.Object) error {
	if f == nil || verb != f.verb || f.times == 0 || !sameKind(obj, f.obj) {
		return nil
	}
	if f.times > 0 {
		f.times--
	}
	f.fired++
	return f.err
}

func sameKind(a, b client.Object) bool { return reflect.TypeOf(a) == reflect.TypeOf(b) }

func (f *fault) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := f.hit("get", obj); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := f.hit("create", obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := f.hit("patch", obj); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}
}

// flakyStore fails its next reads, as an S3 endpoint that drops
// connections does.
type flakyStore struct {
	objectstore.Store
	failures int
}

func (s *flakyStore) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, objectstore.ObjectInfo, error) {
	if s.failures > 0 {
		s.failures--
		return nil, objectstore.ObjectInfo{}, errors.New("s3: get " + key + ": read tcp: connection reset by peer")
	}
	return s.Store.Get(ctx, key, offset, length)
}

var created = time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)

// world is what a DataUpload or DataDownload of VM prod/db finds: the
// running VM and its instance, KubeVirt tracking its changed blocks, with its claim, an
// Available location and its credentials.
func world() []client.Object {
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "db-root", Namespace: "prod"},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"},
		Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: []kubevirtv1.Volume{{
				Name: "rootdisk",
				VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-root"}}},
			}}},
		}},
		Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusRunning,
			ChangedBlockTracking: &kubevirtv1.ChangedBlockTrackingStatus{State: kubevirtv1.ChangedBlockTrackingEnabled}},
	}
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: "vmi-uid"},
		Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}}
	bsl := &velerov1.BackupStorageLocation{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "velero"},
		Spec: velerov1.BackupStorageLocationSpec{
			Provider:    "aws",
			StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{Bucket: "backups", Prefix: "velero"}},
			Config:      map[string]string{"region": "us-east-1", "s3Url": "http://127.0.0.1:9"},
		},
		Status: velerov1.BackupStorageLocationStatus{Phase: velerov1.BackupStorageLocationPhaseAvailable},
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: defaultCredentialsSecret, Namespace: "velero"},
		Data:       map[string][]byte{defaultCredentialsKey: []byte("[default]\naws_access_key_id = a\naws_secret_access_key = b\n")},
	}
	return []client.Object{claim, vm, vmi, bsl, secret}
}

// fakeAPI is a fake API server holding objs whose answers f spoils.
func fakeAPI(f *fault, objs ...client.Object) client.Client {
	scheme, err := NewScheme()
	Expect(err).NotTo(HaveOccurred())
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&velerov2.DataUpload{}, indexVM, vmIndexValue).Build()
	return interceptor.NewClient(c, f.funcs())
}

func request(o client.Object) ctrl.Request {
	return ctrl.Request{NamespacedName: client.ObjectKeyFromObject(o)}
}

var _ = Describe("the DataUpload controller facing API errors", func() {
	var (
		ctx   context.Context
		c     client.Client
		r     *DataUploadReconciler
		du    *velerov2.DataUpload
		store *objectstoretest.Memory
	)

	// setUp runs the controller against the fake API server with the
	// DataUpload of VM prod/db Accepted; remove drops objects of the
	// world.
	setUp := func(f *fault, remove ...client.Object) {
		ctx = context.Background()
		du = &velerov2.DataUpload{
			ObjectMeta: metav1.ObjectMeta{Name: "nightly-db", Namespace: "velero", CreationTimestamp: metav1.NewTime(created),
				Labels:      map[string]string{LabelBackupName: "nightly"},
				Annotations: map[string]string{AnnotationVMName: "db", AnnotationVMNamespace: "prod"}},
			Spec:   velerov2.DataUploadSpec{DataMover: DataMover, BackupStorageLocation: "default", SourceNamespace: "prod", SourcePVC: "db-root"},
			Status: velerov2.DataUploadStatus{Phase: velerov2.DataUploadPhaseAccepted},
		}
		var objs []client.Object
		for _, o := range world() {
			if len(remove) == 0 || !sameKind(o, remove[0]) {
				objs = append(objs, o)
			}
		}
		c = fakeAPI(f, append(objs, du)...)
		store = objectstoretest.NewMemory()
		r = &DataUploadReconciler{Client: c, Reader: c, Recorder: record.NewFakeRecorder(100),
			Now:            func() time.Time { return created.Add(time.Minute) },
			openRepository: func(*location) (*backup.Repository, error) { return backup.NewRepository(store), nil }}
		r.Config.defaults()
	}

	current := func() *velerov2.DataUpload {
		out := &velerov2.DataUpload{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(du), out)).To(Succeed())
		return out
	}

	vmBackupExists := func() bool {
		u := kubevirtbackup.NewUnstructured(kubevirtbackup.VMBackupGVK)
		err := c.Get(ctx, client.ObjectKey{Namespace: "prod", Name: "kubevirt-backup-nightly-db"}, u)
		if apierrors.IsNotFound(err) {
			return false
		}
		Expect(err).NotTo(HaveOccurred())
		return true
	}

	It("starts KubeVirt's backup when nothing fails", func() {
		setUp(nil)
		_, err := r.Reconcile(ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		Expect(vmBackupExists()).To(BeTrue())
		Expect(current().Status.Message).To(Equal("waiting for VirtualMachineBackup prod/kubevirt-backup-nightly-db"))
	})

	DescribeTable("retries an error that may pass, keeps its cause, then goes on",
		func(f *fault, is func(error) bool) {
			setUp(f)
			_, err := r.Reconcile(ctx, request(du))
			Expect(f.fired).To(Equal(1))
			Expect(err).To(HaveOccurred(), "returned to the work queue, which retries with backoff")
			Expect(is(err)).To(BeTrue(), "the cause is kept: %v", err)
			Expect(current().Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))

			_, err = r.Reconcile(ctx, request(du))
			Expect(err).NotTo(HaveOccurred())
			Expect(vmBackupExists()).To(BeTrue())
			Expect(current().Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))
			Expect(current().Status.Message).To(Equal("waiting for VirtualMachineBackup prod/kubevirt-backup-nightly-db"))
		},
		Entry("a server error reading the VM's claim",
			&fault{verb: "get", obj: &corev1.PersistentVolumeClaim{}, err: apierrors.NewInternalError(errors.New("etcdserver: leader changed")), times: 1},
			apierrors.IsInternalError),
		Entry("a timeout reading the VM's claim",
			&fault{verb: "get", obj: &corev1.PersistentVolumeClaim{}, err: apierrors.NewTimeoutError("request did not complete within 60s", 1), times: 1},
			apierrors.IsTimeout),
		Entry("throttling reading the VM",
			&fault{verb: "get", obj: &kubevirtv1.VirtualMachine{}, err: apierrors.NewTooManyRequests("slow down", 1), times: 1},
			apierrors.IsTooManyRequests),
		Entry("an unavailable webhook creating the temporary claim",
			&fault{verb: "create", obj: &corev1.PersistentVolumeClaim{}, err: apierrors.NewServiceUnavailable("admission webhook unreachable"), times: 1},
			apierrors.IsServiceUnavailable),
		Entry("a conflict writing the DataUpload",
			&fault{verb: "patch", obj: &velerov2.DataUpload{}, err: apierrors.NewConflict(schema.GroupResource{Group: "velero.io", Resource: "datauploads"}, "nightly-db", errors.New("the object has been modified")), times: 1},
			apierrors.IsConflict),
	)

	DescribeTable("fails on what a retry cannot change, with the reason",
		func(f *fault, remove client.Object, want string) {
			if remove != nil {
				setUp(f, remove)
			} else {
				setUp(f)
			}
			_, err := r.Reconcile(ctx, request(du))
			Expect(err).NotTo(HaveOccurred())
			failed := current()
			Expect(failed.Status.Phase).To(Equal(velerov2.DataUploadPhaseFailed))
			Expect(failed.Status.Message).To(MatchRegexp(want))
			Expect(vmBackupExists()).To(BeFalse())
		},
		Entry("the VM is gone", nil, &kubevirtv1.VirtualMachine{}, `^VirtualMachine prod/db not found$`),
		Entry("the VM's claim is gone", nil, &corev1.PersistentVolumeClaim{},
			`^volume rootdisk of VirtualMachine prod/db: claim db-root: persistentvolumeclaims "db-root" not found$`),
		Entry("the API server refuses the temporary claim as invalid",
			&fault{verb: "create", obj: &corev1.PersistentVolumeClaim{}, times: -1, err: apierrors.NewInvalid(
				schema.GroupKind{Kind: "PersistentVolumeClaim"}, "kubevirt-backup-nightly-db",
				field.ErrorList{field.Invalid(field.NewPath("spec", "storageClassName"), "Fast_SSD", "must be a lowercase RFC 1123 subdomain")})},
			nil, `^create temporary volume prod/kubevirt-backup-nightly-db: PersistentVolumeClaim "kubevirt-backup-nightly-db" is invalid: spec.storageClassName: Invalid value: "Fast_SSD": must be a lowercase RFC 1123 subdomain$`),
	)
})

var _ = Describe("the DataDownload controller facing store errors", func() {
	It("retries a store it could not read and fails on a backup the store does not hold", func() {
		ctx := context.Background()
		dd := &velerov2.DataDownload{
			ObjectMeta: metav1.ObjectMeta{Name: "restore-db", Namespace: "velero", CreationTimestamp: metav1.NewTime(created)},
			Spec: velerov2.DataDownloadSpec{DataMover: DataMover, BackupStorageLocation: "default", SourceNamespace: "prod",
				SnapshotID: SnapshotID("nightly", "prod", "db"), TargetVolume: velerov2.TargetVolumeSpec{PVC: "db-root", Namespace: "prod"}},
			Status: velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseAccepted},
		}
		c := fakeAPI(nil, append(world(), dd)...)
		store := &flakyStore{Store: objectstoretest.NewMemory(), failures: 1}
		r := &DataDownloadReconciler{Client: c, Reader: c, Recorder: record.NewFakeRecorder(100),
			Now:            func() time.Time { return created.Add(time.Minute) },
			openRepository: func(*location) (*backup.Repository, error) { return backup.NewRepository(store), nil }}
		r.Config.defaults()
		phase := func() *velerov2.DataDownload {
			out := &velerov2.DataDownload{}
			Expect(c.Get(ctx, client.ObjectKeyFromObject(dd), out)).To(Succeed())
			return out
		}

		_, err := r.Reconcile(ctx, request(dd))
		Expect(err).To(MatchError(ContainSubstring("connection reset by peer")))
		Expect(phase().Status.Phase).To(Equal(velerov2.DataDownloadPhaseAccepted))

		_, err = r.Reconcile(ctx, request(dd))
		Expect(err).NotTo(HaveOccurred())
		Expect(phase().Status.Phase).To(Equal(velerov2.DataDownloadPhaseFailed))
		Expect(phase().Status.Message).To(Equal("backup nightly of prod/db: resolve chain of prod/db: backup nightly is not in the store"))
	})
})
