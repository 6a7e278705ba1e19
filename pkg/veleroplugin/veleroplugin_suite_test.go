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

package veleroplugin_test

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

func TestVeleroplugin(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "veleroplugin Suite")
}

const veleroNamespace = "velero"

var (
	scheme *runtime.Scheme
	log    logrus.FieldLogger
)

var _ = BeforeSuite(func() {
	var err error
	scheme, err = datamover.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	l := logrus.New()
	l.SetOutput(io.Discard)
	log = l
})

// newClient is a fake API server holding objs, whose requests funcs may
// intercept.
func newClient(funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	return interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource().Build(), funcs)
}

// claimVolume is a VM volume backed by claim.
func claimVolume(name, claim string) kubevirtv1.Volume {
	return kubevirtv1.Volume{Name: name, VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
		PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
}

// runningVM is prod/db, running, with a root disk and a data disk.
func runningVM() *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	return &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod", UID: types.UID("vm-uid")},
		Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: &always, Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: []kubevirtv1.Volume{
				claimVolume("rootdisk", "db-root"),
				{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{UserData: "#cloud-config"}}},
				{Name: "data", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "db-data"}}},
			}},
		}},
		Status: kubevirtv1.VirtualMachineStatus{PrintableStatus: kubevirtv1.VirtualMachineStatusRunning},
	}
}

// item is obj as Velero hands it to an action, decoded from the JSON of
// the backup, with a field this build of the KubeVirt API does not know.
func item(obj runtime.Object) *unstructured.Unstructured {
	data, err := json.Marshal(obj)
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{}
	Expect(u.UnmarshalJSON(data)).To(Succeed())
	Expect(unstructured.SetNestedField(u.Object, "kept", "spec", "fieldFromTheFuture")).To(Succeed())
	return u
}

// kubevirtBackup is Velero's backup "tue" selecting the data mover.
func kubevirtBackup() *velerov1.Backup {
	return &velerov1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: "tue", Namespace: veleroNamespace, UID: types.UID("backup-uid")},
		Spec: velerov1.BackupSpec{
			DataMover: datamover.DataMover, StorageLocation: "default",
			ItemOperationTimeout: metav1.Duration{Duration: time.Hour},
		},
		Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseInProgress},
	}
}

// ctx is for the specs' own reads.
var ctx = context.Background()

// nestedString reads a string field of u, "" when it is not there.
func nestedString(u *unstructured.Unstructured, fields ...string) string {
	s, _, err := unstructured.NestedString(u.Object, fields...)
	Expect(err).NotTo(HaveOccurred())
	return s
}
