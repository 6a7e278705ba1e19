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
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/vmware-tanzu/velero/pkg/apis/velero/shared"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

func dataUploads(c client.Client) []velerov2.DataUpload {
	list := &velerov2.DataUploadList{}
	Expect(c.List(ctx, list)).To(Succeed())
	return list.Items
}

var unavailable = apierrors.NewServiceUnavailable("etcd is compacting")

var _ = Describe("the backup action", func() {
	var (
		c      client.WithWatch
		action *veleroplugin.BackupAction
	)
	BeforeEach(func() {
		c = newClient(interceptor.Funcs{})
		action = veleroplugin.NewBackupAction(c, log)
	})

	It("applies to VirtualMachines", func() {
		sel, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(sel.IncludedResources).To(ConsistOf("virtualmachines.kubevirt.io"))
		Expect(action.Name()).To(Equal(veleroplugin.BackupActionName))
	})

	It("creates the DataUpload the controller serves and reports it as an operation", func() {
		b := kubevirtBackup()
		updated, additional, opID, post, err := action.Execute(item(runningVM()), b)
		Expect(err).NotTo(HaveOccurred())
		Expect(additional).To(BeEmpty())
		Expect(opID).To(HavePrefix("du-"))
		Expect(len(opID)).To(BeNumerically("<=", 63), "a label value")

		dus := dataUploads(c)
		Expect(dus).To(HaveLen(1))
		du := dus[0]
		Expect(du.Namespace).To(Equal(veleroNamespace))
		Expect(du.Labels).To(Equal(map[string]string{
			velerov1.BackupNameLabel: "tue", velerov1.BackupUIDLabel: "backup-uid", velerov1.AsyncOperationIDLabel: opID,
		}))
		Expect(du.Annotations).To(Equal(map[string]string{
			datamover.AnnotationVMName: "db", datamover.AnnotationVMNamespace: "prod",
			datamover.AnnotationBackupName: "tue", datamover.AnnotationOperationID: opID,
		}))
		Expect(du.OwnerReferences).To(HaveLen(1))
		owner := du.OwnerReferences[0]
		Expect([]string{owner.APIVersion, owner.Kind, owner.Name, string(owner.UID)}).To(Equal([]string{"velero.io/v1", "Backup", "tue", "backup-uid"}))
		Expect(owner.Controller).To(HaveValue(BeTrue()))
		Expect(du.Spec).To(Equal(velerov2.DataUploadSpec{
			SnapshotType: velerov2.SnapshotTypeCSI, SourcePVC: "db-root", DataMover: "kubevirt",
			BackupStorageLocation: "default", SourceNamespace: "prod",
			OperationTimeout: metav1.Duration{Duration: time.Hour},
		}))
		backupName, vm, err := datamover.UploadTarget(&du)
		Expect(err).NotTo(HaveOccurred())
		Expect(backupName).To(Equal("tue"))
		Expect(vm).To(Equal(catalog.VM{Namespace: "prod", Name: "db"}))

		Expect(post).To(Equal([]velero.ResourceIdentifier{{
			GroupResource: schema.GroupResource{Group: "velero.io", Resource: "datauploads"}, Namespace: veleroNamespace, Name: du.Name,
		}}))
		u := updated.(*unstructured.Unstructured)
		Expect(u.GetAnnotations()).To(HaveKeyWithValue(velerov1.DataUploadNameAnnotation, veleroNamespace+"/"+du.Name))
		Expect(nestedString(u, "spec", "fieldFromTheFuture")).To(Equal("kept"))
	})

	It("asks for a full backup when the backup or the VM says so, and passes the VM's volume size on", func() {
		b := kubevirtBackup()
		b.Annotations = map[string]string{datamover.AnnotationForceFull: "true"}
		_, _, _, _, err := action.Execute(item(runningVM()), b)
		Expect(err).NotTo(HaveOccurred())
		Expect(dataUploads(c)[0].Annotations).To(HaveKeyWithValue(datamover.AnnotationForceFull, "true"))

		c = newClient(interceptor.Funcs{})
		action = veleroplugin.NewBackupAction(c, log)
		vm := runningVM()
		vm.Annotations = map[string]string{datamover.AnnotationForceFull: "True", datamover.AnnotationBackupPVCSize: "20Gi"}
		_, _, _, _, err = action.Execute(item(vm), kubevirtBackup())
		Expect(err).NotTo(HaveOccurred())
		Expect(dataUploads(c)[0].Annotations).To(And(
			HaveKeyWithValue(datamover.AnnotationForceFull, "true"),
			HaveKeyWithValue(datamover.AnnotationBackupPVCSize, "20Gi")))
	})

	It("defaults the operation timeout to Velero's", func() {
		b := kubevirtBackup()
		b.Spec.ItemOperationTimeout = metav1.Duration{}
		_, _, _, _, err := action.Execute(item(runningVM()), b)
		Expect(err).NotTo(HaveOccurred())
		Expect(dataUploads(c)[0].Spec.OperationTimeout.Duration).To(Equal(4 * time.Hour))
	})

	DescribeTable("leaves to Velero",
		func(changeBackup func(*velerov1.Backup), changeVM func(*kubevirtv1.VirtualMachine)) {
			b, vm := kubevirtBackup(), runningVM()
			changeBackup(b)
			changeVM(vm)
			in := item(vm)
			updated, additional, opID, post, err := action.Execute(in, b)
			Expect(err).NotTo(HaveOccurred())
			Expect(updated).To(BeIdenticalTo(in))
			Expect(additional).To(BeEmpty())
			Expect(opID).To(BeEmpty())
			Expect(post).To(BeEmpty())
			Expect(dataUploads(c)).To(BeEmpty())
		},
		Entry("a backup of Velero's own data mover", func(b *velerov1.Backup) { b.Spec.DataMover = "" }, func(*kubevirtv1.VirtualMachine) {}),
		Entry("a backup of another data mover", func(b *velerov1.Backup) { b.Spec.DataMover = "velero" }, func(*kubevirtv1.VirtualMachine) {}),
		Entry("a backup Velero finalizes", func(b *velerov1.Backup) { b.Status.Phase = velerov1.BackupPhaseFinalizing }, func(*kubevirtv1.VirtualMachine) {}),
		Entry("a stopped VM", func(*velerov1.Backup) {}, func(vm *kubevirtv1.VirtualMachine) {
			vm.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusStopped
		}),
		Entry("a VM without disks on claims", func(*velerov1.Backup) {}, func(vm *kubevirtv1.VirtualMachine) {
			vm.Spec.Template.Spec.Volumes = vm.Spec.Template.Spec.Volumes[1:2]
		}),
	)

	It("finds the DataUpload of an earlier call for the same backup and VM", func() {
		_, _, first, _, err := action.Execute(item(runningVM()), kubevirtBackup())
		Expect(err).NotTo(HaveOccurred())
		_, _, second, post, err := action.Execute(item(runningVM()), kubevirtBackup())
		Expect(err).NotTo(HaveOccurred())
		Expect(second).To(Equal(first))
		Expect(dataUploads(c)).To(HaveLen(1))
		Expect(post[0].Name).To(Equal(dataUploads(c)[0].Name))
	})

	It("refuses a DataUpload of the same name that is not the backup's of the VM", func() {
		_, _, _, _, err := action.Execute(item(runningVM()), kubevirtBackup())
		Expect(err).NotTo(HaveOccurred())
		du := dataUploads(c)[0]
		du.Annotations[datamover.AnnotationVMName] = "web"
		Expect(c.Update(ctx, &du)).To(Succeed())
		_, _, _, _, err = action.Execute(item(runningVM()), kubevirtBackup())
		Expect(err).To(MatchError(ContainSubstring("is not this backup's of this VirtualMachine")))
	})

	It("retries a create the API server could not serve", func() {
		failures := 2
		c = newClient(interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if failures > 0 {
				failures--
				return unavailable
			}
			return cl.Create(ctx, obj, opts...)
		}})
		action = veleroplugin.NewBackupAction(c, log)
		_, _, opID, _, err := action.Execute(item(runningVM()), kubevirtBackup())
		Expect(err).NotTo(HaveOccurred())
		Expect(opID).NotTo(BeEmpty())
		Expect(dataUploads(c)).To(HaveLen(1))
	})

	Describe("progress", func() {
		var opID string
		BeforeEach(func() {
			var err error
			_, _, opID, _, err = action.Execute(item(runningVM()), kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
		})
		setStatus := func(s velerov2.DataUploadStatus) {
			du := dataUploads(c)[0]
			du.Status = s
			Expect(c.Update(ctx, &du)).To(Succeed())
		}

		It("is nothing yet for a new DataUpload", func() {
			p, err := action.Progress(opID, kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeFalse())
			Expect(p.NTotal).To(BeZero())
		})

		It("counts bytes while the upload runs", func() {
			start := metav1.NewTime(time.Date(2025, 12, 2, 3, 4, 5, 0, time.UTC))
			setStatus(velerov2.DataUploadStatus{Phase: velerov2.DataUploadPhaseInProgress, Message: "upload pod prod/x is running",
				StartTimestamp: &start, Progress: shared.DataMoveOperationProgress{BytesDone: 10, TotalBytes: 40}})
			p, err := action.Progress(opID, kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeFalse())
			Expect(p.Err).To(BeEmpty())
			Expect([]int64{p.NCompleted, p.NTotal}).To(Equal([]int64{10, 40}))
			Expect(p.OperationUnits).To(Equal("Bytes"))
			Expect(p.Description).To(Equal("InProgress: upload pod prod/x is running"))
			Expect(p.Started).To(BeTemporally("==", start.Time))
		})

		DescribeTable("ends with the DataUpload",
			func(phase velerov2.DataUploadPhase, wantErr string) {
				done := metav1.Now()
				setStatus(velerov2.DataUploadStatus{Phase: phase, Message: "upload pod prod/x failed: disk full", CompletionTimestamp: &done})
				p, err := action.Progress(opID, kubevirtBackup())
				Expect(err).NotTo(HaveOccurred())
				Expect(p.Completed).To(BeTrue())
				if wantErr != "" {
					wantErr = fmt.Sprintf(wantErr, dataUploads(c)[0].Name)
				}
				Expect(p.Err).To(Equal(wantErr))
				Expect(p.Updated).To(BeTemporally("~", done.Time, time.Second))
			},
			Entry("completed", velerov2.DataUploadPhaseCompleted, ""),
			Entry("failed, with its message", velerov2.DataUploadPhaseFailed, "DataUpload %s failed: upload pod prod/x failed: disk full"),
			Entry("canceled", velerov2.DataUploadPhaseCanceled, "DataUpload %s is canceled"),
		)

		It("fails the operation whose DataUpload is gone", func() {
			Expect(c.DeleteAllOf(ctx, &velerov2.DataUpload{}, client.InNamespace(veleroNamespace))).To(Succeed())
			_, err := action.Progress(opID, kubevirtBackup())
			Expect(err).To(MatchError(ContainSubstring("no DataUpload of operation " + opID)))
		})

		It("asks again when the API server could not answer", func() {
			failing := veleroplugin.NewBackupAction(newClient(interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
				return unavailable
			}}), log)
			p, err := failing.Progress(opID, kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeFalse())
			Expect(p.Description).To(ContainSubstring("waiting: list DataUploads of operation"))
		})

		It("needs an operation ID", func() {
			_, err := action.Progress("", kubevirtBackup())
			Expect(err).To(HaveOccurred())
		})
	})

	Describe("cancel", func() {
		It("sets spec.cancel on a live DataUpload, through a failed request", func() {
			failures := 1
			c = newClient(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if failures > 0 {
					failures--
					return unavailable
				}
				return cl.Patch(ctx, obj, patch, opts...)
			}})
			action = veleroplugin.NewBackupAction(c, log)
			_, _, opID, _, err := action.Execute(item(runningVM()), kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
			Expect(action.Cancel(opID, kubevirtBackup())).To(Succeed())
			Expect(dataUploads(c)[0].Spec.Cancel).To(BeTrue())
		})

		It("leaves an ended DataUpload and a missing one alone", func() {
			_, _, opID, _, err := action.Execute(item(runningVM()), kubevirtBackup())
			Expect(err).NotTo(HaveOccurred())
			du := dataUploads(c)[0]
			du.Status.Phase = velerov2.DataUploadPhaseCompleted
			Expect(c.Update(ctx, &du)).To(Succeed())
			Expect(action.Cancel(opID, kubevirtBackup())).To(Succeed())
			Expect(dataUploads(c)[0].Spec.Cancel).To(BeFalse())
			Expect(action.Cancel("du-unknown", kubevirtBackup())).To(Succeed())
		})
	})
})
