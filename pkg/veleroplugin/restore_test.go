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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

func dataDownloads(c client.Client) []velerov2.DataDownload {
	list := &velerov2.DataDownloadList{}
	Expect(c.List(ctx, list)).To(Succeed())
	return list.Items
}

// savedVM is the VM as the backup action left it in the backup.
func savedVM(vm *kubevirtv1.VirtualMachine) *unstructured.Unstructured {
	u := item(vm)
	a := u.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[velerov1.DataUploadNameAnnotation] = veleroNamespace + "/tue-db-1234abcd"
	u.SetAnnotations(a)
	return u
}

// restoreInput is Velero's input for the restore "thu" of backup "tue"
// into namespace staging.
func restoreInput(saved *unstructured.Unstructured) *velero.RestoreItemActionExecuteInput {
	return &velero.RestoreItemActionExecuteInput{
		Item:           saved.DeepCopy(),
		ItemFromBackup: saved,
		Restore: &velerov1.Restore{
			ObjectMeta: metav1.ObjectMeta{Name: "thu", Namespace: veleroNamespace, UID: types.UID("restore-uid")},
			Spec: velerov1.RestoreSpec{BackupName: "tue", NamespaceMapping: map[string]string{"prod": "staging"},
				ItemOperationTimeout: metav1.Duration{Duration: 2 * time.Hour}},
		},
	}
}

var _ = Describe("the restore action", func() {
	var (
		c      client.WithWatch
		action *veleroplugin.RestoreAction
	)
	BeforeEach(func() {
		c = newClient(interceptor.Funcs{}, kubevirtBackup())
		action = veleroplugin.NewRestoreAction(c, log)
	})

	It("applies to VirtualMachines", func() {
		sel, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(sel.IncludedResources).To(ConsistOf("virtualmachines.kubevirt.io"))
		Expect(action.Name()).To(Equal(veleroplugin.RestoreActionName))
		ready, err := action.AreAdditionalItemsReady(nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(ready).To(BeTrue())
	})

	It("creates a DataDownload per disk of the backup and restores the VM stopped", func() {
		in := restoreInput(savedVM(runningVM()))
		out, err := action.Execute(in)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.OperationID).To(HavePrefix("dd-"))
		Expect(out.AdditionalItems).To(BeEmpty())
		Expect(out.SkipRestore).To(BeFalse())

		dds := dataDownloads(c)
		Expect(dds).To(HaveLen(2))
		claims := []string{}
		for _, dd := range dds {
			claims = append(claims, dd.Spec.TargetVolume.PVC)
			Expect(dd.Namespace).To(Equal(veleroNamespace))
			Expect(dd.Labels).To(Equal(map[string]string{
				velerov1.RestoreNameLabel: "thu", velerov1.RestoreUIDLabel: "restore-uid", velerov1.AsyncOperationIDLabel: out.OperationID,
			}))
			Expect(dd.Annotations).To(Equal(map[string]string{
				datamover.AnnotationVMName: "db", datamover.AnnotationVMNamespace: "prod", datamover.AnnotationOperationID: out.OperationID,
				datamover.AnnotationTargetVMName: "db",
			}))
			Expect(dd.OwnerReferences).To(HaveLen(1))
			Expect([]string{dd.OwnerReferences[0].Kind, dd.OwnerReferences[0].Name, string(dd.OwnerReferences[0].UID)}).To(Equal([]string{"Restore", "thu", "restore-uid"}))
			Expect(dd.Spec).To(Equal(velerov2.DataDownloadSpec{
				TargetVolume:          velerov2.TargetVolumeSpec{PVC: dd.Spec.TargetVolume.PVC, Namespace: "staging"},
				BackupStorageLocation: "default", DataMover: "kubevirt",
				SnapshotID: datamover.SnapshotID("tue", "prod", "db"), SourceNamespace: "prod",
				DataMoverConfig:  map[string]string{datamover.ConfigDisk: dd.Spec.TargetVolume.PVC},
				OperationTimeout: metav1.Duration{Duration: 2 * time.Hour},
			}))
		}
		Expect(claims).To(ConsistOf("db-root", "db-data"))

		vm := out.UpdatedItem.(*unstructured.Unstructured)
		Expect(nestedString(vm, "spec", "runStrategy")).To(Equal("Halted"))
		Expect(nestedString(vm, "spec", "fieldFromTheFuture")).To(Equal("kept"))
		Expect(vm.GetAnnotations()).To(Equal(map[string]string{
			datamover.AnnotationOriginalRunStrategy: "Always", datamover.AnnotationOriginalRunStrategySource: "runStrategy",
		}))
		Expect(in.ItemFromBackup.(*unstructured.Unstructured).GetAnnotations()).To(HaveKey(velerov1.DataUploadNameAnnotation), "the backup's item is left as it was")
	})

	It("names the VM as restored, for the controller to restart it, when the restore renames it", func() {
		in := restoreInput(savedVM(runningVM()))
		in.Item.(*unstructured.Unstructured).SetName("db-copy")
		out, err := action.Execute(in)
		Expect(err).NotTo(HaveOccurred())
		for _, dd := range dataDownloads(c) {
			Expect(dd.Annotations).To(HaveKeyWithValue(datamover.AnnotationTargetVMName, "db-copy"))
			Expect(dd.Spec.SnapshotID).To(Equal(datamover.SnapshotID("tue", "prod", "db")), "the catalog's VM is the one the backup saved")
		}
		Expect(out.UpdatedItem.(*unstructured.Unstructured).GetName()).To(Equal("db-copy"))
	})

	It("keeps the deprecated running field's meaning", func() {
		vm := runningVM()
		running := true
		vm.Spec.RunStrategy, vm.Spec.Running = nil, &running
		out, err := action.Execute(restoreInput(savedVM(vm)))
		Expect(err).NotTo(HaveOccurred())
		u := out.UpdatedItem.(*unstructured.Unstructured)
		_, found, _ := unstructured.NestedBool(u.Object, "spec", "running")
		Expect(found).To(BeFalse())
		Expect(nestedString(u, "spec", "runStrategy")).To(Equal("Halted"))
		Expect(u.GetAnnotations()).To(Equal(map[string]string{
			datamover.AnnotationOriginalRunStrategy: "Always", datamover.AnnotationOriginalRunStrategySource: "running",
		}))
	})

	It("records nothing for a VM that was stopped", func() {
		vm := runningVM()
		halted := kubevirtv1.RunStrategyHalted
		vm.Spec.RunStrategy = &halted
		out, err := action.Execute(restoreInput(savedVM(vm)))
		Expect(err).NotTo(HaveOccurred())
		Expect(out.UpdatedItem.(*unstructured.Unstructured).GetAnnotations()).To(BeEmpty())
		Expect(dataDownloads(c)).To(HaveLen(2))
	})

	DescribeTable("leaves to Velero",
		func(in func() *velero.RestoreItemActionExecuteInput, backup func(*velerov1.Backup)) {
			b := kubevirtBackup()
			backup(b)
			c = newClient(interceptor.Funcs{}, b)
			action = veleroplugin.NewRestoreAction(c, log)
			input := in()
			out, err := action.Execute(input)
			Expect(err).NotTo(HaveOccurred())
			Expect(out.UpdatedItem).To(BeIdenticalTo(input.Item))
			Expect(out.OperationID).To(BeEmpty())
			Expect(dataDownloads(c)).To(BeEmpty())
		},
		Entry("a VM the backup action did not save",
			func() *velero.RestoreItemActionExecuteInput { return restoreInput(item(runningVM())) }, func(*velerov1.Backup) {}),
		Entry("a restore without volumes", func() *velero.RestoreItemActionExecuteInput {
			in := restoreInput(savedVM(runningVM()))
			no := false
			in.Restore.Spec.RestorePVs = &no
			return in
		}, func(*velerov1.Backup) {}),
		Entry("a backup of another data mover",
			func() *velero.RestoreItemActionExecuteInput { return restoreInput(savedVM(runningVM())) },
			func(b *velerov1.Backup) { b.Spec.DataMover = "velero" }),
	)

	It("fails when the backup is gone", func() {
		c = newClient(interceptor.Funcs{})
		action = veleroplugin.NewRestoreAction(c, log)
		_, err := action.Execute(restoreInput(savedVM(runningVM())))
		Expect(err).To(MatchError(ContainSubstring("get backup tue of restore thu")))
	})

	It("finds the DataDownloads of an earlier call", func() {
		first, err := action.Execute(restoreInput(savedVM(runningVM())))
		Expect(err).NotTo(HaveOccurred())
		second, err := action.Execute(restoreInput(savedVM(runningVM())))
		Expect(err).NotTo(HaveOccurred())
		Expect(second.OperationID).To(Equal(first.OperationID))
		Expect(dataDownloads(c)).To(HaveLen(2))
	})

	Describe("progress and cancel", func() {
		var (
			opID    string
			restore *velerov1.Restore
		)
		BeforeEach(func() {
			in := restoreInput(savedVM(runningVM()))
			out, err := action.Execute(in)
			Expect(err).NotTo(HaveOccurred())
			opID, restore = out.OperationID, in.Restore
		})
		setStatus := func(claim string, s velerov2.DataDownloadStatus) {
			for _, dd := range dataDownloads(c) {
				if dd.Spec.TargetVolume.PVC == claim {
					dd.Status = s
					Expect(c.Update(ctx, &dd)).To(Succeed())
				}
			}
		}

		It("sums the disks and completes when every one has", func() {
			setStatus("db-root", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseCompleted})
			setStatus("db-data", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseInProgress})
			for _, dd := range dataDownloads(c) {
				dd.Status.Progress.BytesDone, dd.Status.Progress.TotalBytes = 5, 10
				Expect(c.Update(ctx, &dd)).To(Succeed())
			}
			p, err := action.Progress(opID, restore)
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeFalse())
			Expect([]int64{p.NCompleted, p.NTotal}).To(Equal([]int64{10, 20}))
			Expect(p.Description).To(HavePrefix("1 of 2 DataDownloads completed; "))

			setStatus("db-data", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseCompleted})
			p, err = action.Progress(opID, restore)
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeTrue())
			Expect(p.Err).To(BeEmpty())
		})

		It("fails once every disk has ended, naming the ones that failed", func() {
			setStatus("db-root", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseFailed, Message: "backup tue of prod/db holds no disk db-root"})
			p, err := action.Progress(opID, restore)
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeFalse(), "the other disk still restores")
			setStatus("db-data", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseCanceled})
			p, err = action.Progress(opID, restore)
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Completed).To(BeTrue())
			Expect(p.Err).To(And(ContainSubstring("holds no disk db-root"), ContainSubstring("is canceled")))
		})

		It("fails the operation whose DataDownloads are gone, and needs an ID", func() {
			Expect(c.DeleteAllOf(ctx, &velerov2.DataDownload{}, client.InNamespace(veleroNamespace))).To(Succeed())
			_, err := action.Progress(opID, restore)
			Expect(err).To(MatchError(ContainSubstring("no DataDownload of operation")))
			_, err = action.Progress("", restore)
			Expect(err).To(HaveOccurred())
		})

		It("cancels the live DataDownloads", func() {
			setStatus("db-root", velerov2.DataDownloadStatus{Phase: velerov2.DataDownloadPhaseCompleted})
			Expect(action.Cancel(opID, restore)).To(Succeed())
			canceled := map[string]bool{}
			for _, dd := range dataDownloads(c) {
				canceled[dd.Spec.TargetVolume.PVC] = dd.Spec.Cancel
			}
			Expect(canceled).To(Equal(map[string]bool{"db-root": false, "db-data": true}))
			Expect(action.Cancel("dd-unknown", restore)).To(Succeed())
		})
	})
})
