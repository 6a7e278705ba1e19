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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
)

var _ = Describe("the cluster-wide limits", func() {
	// other is a DataUpload of another VM, created age before ours, in
	// phase.
	other := func(name string, age time.Duration, phase velerov2.DataUploadPhase) *velerov2.DataUpload {
		return with(newUpload(phase), func(du *velerov2.DataUpload) {
			du.Name, du.UID, du.CreationTimestamp = name, types.UID(name+"-uid"), metav1.NewTime(created.Add(-age))
			du.Annotations[AnnotationVMName] = name
		})
	}
	// ownedBy makes o an object of DataUpload du.
	ownedBy := func(o client.Object, du *velerov2.DataUpload) client.Object {
		o.SetName(childName("kubevirt-backup", du.Name))
		o.SetLabels(ownerLabels(KindDataUpload, du.UID))
		o.SetAnnotations(ownerAnnotations(du.Namespace, du.Name))
		return o
	}
	reconcile := func(du *velerov2.DataUpload, config Config, objs ...client.Object) (*velerov2.DataUpload, string) {
		t := newStepper(step{objs: objs}, du)
		storeBackup(t.ctx, t)
		r := &DataUploadReconciler{Client: t.c, Reader: t.c, Recorder: t.recorder, Config: config, Now: t.clock.Now,
			openRepository: t.repository}
		r.Config.defaults()
		_, err := r.Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		out := &velerov2.DataUpload{}
		Expect(t.c.Get(t.ctx, client.ObjectKeyFromObject(du), out)).To(Succeed())
		return out, t.lastEvent()
	}
	running := func(du *velerov2.DataUpload) client.Object { return ownedBy(vmBackup(nil), du) }
	ended := func(du *velerov2.DataUpload) client.Object {
		return ownedBy(vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-9")), du)
	}

	DescribeTable("hold a VM's backup until fewer VirtualMachineBackups run than -concurrent-vm-backups allows, oldest first",
		func(limit int, objs func() []client.Object, message string) {
			du, event := reconcile(newUpload(velerov2.DataUploadPhaseAccepted), Config{MaxVMBackups: limit}, objs()...)
			if message == "" {
				Expect(du.Status.Message).NotTo(ContainSubstring("slot"))
				return
			}
			Expect(du.Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))
			Expect(du.Status.Message).To(Equal(message))
			Expect(event).To(HavePrefix("Normal WaitingForBackupSlot "))
		},
		Entry("one running, limit one", 1, func() []client.Object {
			a := other("a", time.Minute, velerov2.DataUploadPhaseAccepted)
			return []client.Object{a, running(a)}
		}, "waiting for a slot: 1 VM backups run, the most -concurrent-vm-backups=1 allows, and 0 DataUploads wait ahead of this one"),
		Entry("one running and an older one waiting, limit two", 2, func() []client.Object {
			a, b := other("a", 2*time.Minute, velerov2.DataUploadPhaseAccepted), other("b", time.Minute, velerov2.DataUploadPhaseAccepted)
			return []client.Object{a, running(a), b}
		}, "waiting for a slot: 1 VM backups run, the most -concurrent-vm-backups=2 allows, and 1 DataUploads wait ahead of this one"),
		Entry("one running and a newer one waiting, limit two: this one goes", 2, func() []client.Object {
			a, b := other("a", 2*time.Minute, velerov2.DataUploadPhaseAccepted), other("b", -time.Minute, velerov2.DataUploadPhaseAccepted)
			return []client.Object{a, running(a), b}
		}, ""),
		Entry("the one that ran has ended: this one goes", 1, func() []client.Object {
			a := other("a", time.Minute, velerov2.DataUploadPhasePrepared)
			return []client.Object{a, ended(a)}
		}, ""),
		Entry("another data mover's DataUploads do not count", 1, func() []client.Object {
			a := with(other("a", time.Minute, velerov2.DataUploadPhaseAccepted), func(du *velerov2.DataUpload) { du.Spec.DataMover = "velero" })
			return []client.Object{a}
		}, ""),
		Entry("no limit", 0, func() []client.Object {
			a := other("a", time.Minute, velerov2.DataUploadPhaseAccepted)
			return []client.Object{a, running(a)}
		}, ""),
	)

	It("hold an upload until fewer upload pods run than -concurrent-vm-datauploads allows, and let it go when one finishes", func() {
		a := other("a", time.Minute, velerov2.DataUploadPhaseInProgress)
		du := newUpload(velerov2.DataUploadPhasePrepared)
		done := vmBackup(vmBackupIs(kubevirtbackup.ConditionComplete, "", "cp-1"))
		out, event := reconcile(du, Config{MaxUploads: 1}, done, a, ownedBy(moverPod("", corev1.PodRunning, ""), a))
		Expect(out.Status.Phase).To(Equal(velerov2.DataUploadPhasePrepared))
		Expect(out.Status.Message).To(Equal("waiting for a slot: 1 uploads run, the most -concurrent-vm-datauploads=1 allows, and 0 DataUploads wait ahead of this one"))
		Expect(event).To(HavePrefix("Normal WaitingForUploadSlot "))

		out, _ = reconcile(du, Config{MaxUploads: 1}, done, a, ownedBy(moverPod("", corev1.PodSucceeded, `{"bytes":1}`), a))
		Expect(out.Status.Message).NotTo(ContainSubstring("slot"))
	})
})
