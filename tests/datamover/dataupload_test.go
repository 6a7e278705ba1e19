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
	"path/filepath"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

var _ = Describe("DataUpload", func() {
	It("backs up a VM full, then incrementally, and restores the disk from the chain", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)

		By("a first backup, which is full")
		mon := newDataUpload(ctx, vm, loc, "mon")
		Eventually(dataUploadPhase(ctx, mon)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		first := getDataUpload(ctx, mon)
		Expect(first.Status.SnapshotID).To(Equal(datamover.SnapshotID("mon", vm.namespace, vm.name)))
		Expect(first.Status.AcceptedByNode).To(Equal(identity))
		Expect(first.Status.StartTimestamp).NotTo(BeNil())
		Expect(first.Status.CompletionTimestamp).NotTo(BeNil())
		Expect(first.Status.DataMoverResult).NotTo(BeNil())
		result := *first.Status.DataMoverResult
		Expect(result).To(HaveKeyWithValue(datamover.ResultType, string(catalog.Full)))
		Expect(result).To(HaveKey(datamover.ResultFullReason))
		fullBytes, err := strconv.ParseInt(result[datamover.ResultBytes], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		Expect(fullBytes).To(BeNumerically(">", 4<<20))
		Expect(first.Status.Progress.BytesDone).To(Equal(fullBytes))
		Expect(first.Status.Progress.TotalBytes).To(Equal(fullBytes))
		Expect(first.Status.Message).To(ContainSubstring("full checkpoint"))
		expectTemporariesGone(ctx, mon)
		Eventually(eventReasons(ctx, mon)).Should(ContainElements("Accepted", "TrackerCreated", "BackupStarted", "Prepared", "UploadPodCreated", "Completed"))

		repo := loc.repository()
		idx, err := repo.Index(ctx, vm.catalogVM())
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(1))
		full := idx.Checkpoints[0]
		Expect(full.ID).To(Equal(result[datamover.ResultCheckpoint]))
		Expect(full.IsComplete()).To(BeTrue())
		Expect(full.ReferencedBy).To(ConsistOf("mon"))
		Expect(full.Files).To(HaveLen(1))
		Expect(full.Files[0].DiskName).To(Equal(vm.claim))
		Expect(full.VMBObjectPath).NotTo(BeEmpty())
		Expect(full.VMBTObjectPath).NotTo(BeEmpty())

		By("the tracker, kept for the next backup, holding KubeVirt's checkpoint")
		tracker := &unstructured.Unstructured{}
		tracker.SetGroupVersionKind(kubevirtbackup.VMBackupTrackerGVK)
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: "datamover-" + vm.name}, tracker)).To(Succeed())
		latest, _, _ := unstructured.NestedString(tracker.Object, "status", "latestCheckpoint", "name")
		Expect(latest).To(Equal(full.ID))

		By("guest writes, then a second backup, which is incremental")
		Expect(vm.hv.Write(ctx, 16<<20, 1<<20, 0x22)).To(Succeed())
		atTue := filepath.Join(GinkgoT().TempDir(), "tue.raw")
		Expect(vm.hv.Snapshot(ctx, atTue)).To(Succeed())
		tue := newDataUpload(ctx, vm, loc, "tue")
		Eventually(dataUploadPhase(ctx, tue)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		second := *getDataUpload(ctx, tue).Status.DataMoverResult
		Expect(second).To(HaveKeyWithValue(datamover.ResultType, string(catalog.Incremental)))
		Expect(second).To(HaveKeyWithValue(datamover.ResultParent, full.ID))
		incBytes, err := strconv.ParseInt(second[datamover.ResultBytes], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		Expect(incBytes).To(BeNumerically("<", fullBytes/2))
		expectTemporariesGone(ctx, tue)

		By("a DataDownload restoring the disk as the second backup saved it")
		restoreClaim(ctx, vm.namespace, "restored", corev1.PersistentVolumeFilesystem)
		dd := newDataDownload(ctx, getDataUpload(ctx, tue).Status.SnapshotID, vm.namespace, "restored", loc, map[string]string{datamover.ConfigDisk: vm.claim})
		Eventually(dataDownloadPhase(ctx, dd)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataDownloadPhaseCompleted))
		done := getDataDownload(ctx, dd)
		Expect(done.Status.Message).To(ContainSubstring("chain of 2"))
		Expect(done.Status.Progress.BytesDone).To(Equal(fullBytes + incBytes))
		expectRestoredInto(ctx, dd, vm.namespace, "restored", must(testenv.SHA256(atTue)))
	})

	It("runs the backups of one VM one at a time, oldest first", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = true })

		older := newDataUpload(ctx, vm, loc, "a")
		Eventually(gone(ctx, vmBackupOf(older))).Should(BeFalse())
		younger := newDataUpload(ctx, vm, loc, "b")
		Eventually(dataUploadMessage(ctx, younger)).Should(ContainSubstring("waiting for DataUpload " + older.Name))
		Expect(getDataUpload(ctx, younger).Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))
		Expect(gone(ctx, vmBackupOf(younger))()).To(BeTrue(), "no VirtualMachineBackup while another one of the VM runs")

		kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = false })
		Eventually(dataUploadPhase(ctx, older)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		Eventually(dataUploadPhase(ctx, younger)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		a, b := *getDataUpload(ctx, older).Status.DataMoverResult, *getDataUpload(ctx, younger).Status.DataMoverResult
		Expect(a).To(HaveKeyWithValue(datamover.ResultType, string(catalog.Full)))
		Expect(b).To(HaveKeyWithValue(datamover.ResultType, string(catalog.Incremental)))
		Expect(b).To(HaveKeyWithValue(datamover.ResultParent, a[datamover.ResultCheckpoint]))
	})

	DescribeTable("waits for an unavailable backup storage location, then backs up",
		func(ctx context.Context, phase velerov1.BackupStorageLocationPhase, want string) {
			vm := newVM(ctx)
			loc := newLocation(ctx, phase)
			du := newDataUpload(ctx, vm, loc, "wed")
			Eventually(dataUploadMessage(ctx, du)).Should(Equal("waiting: backup storage location " + loc.name + " is " + want))
			Expect(getDataUpload(ctx, du).Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))
			Expect(gone(ctx, vmBackupOf(du))()).To(BeTrue(), "no VirtualMachineBackup before the location is available")
			Eventually(eventReasons(ctx, du)).Should(ContainElement("BackupStorageLocationUnavailable"))

			setLocationPhase(ctx, loc, velerov1.BackupStorageLocationPhaseAvailable)
			Eventually(dataUploadPhase(ctx, du)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		},
		Entry("phase Unavailable", velerov1.BackupStorageLocationPhaseUnavailable, "Unavailable"),
		Entry("not validated yet", velerov1.BackupStorageLocationPhase(""), "not validated yet"),
	)

	It("fails a DataUpload whose backup storage location does not exist", func(ctx context.Context) {
		vm := newVM(ctx)
		du := newDataUpload(ctx, vm, &location{name: "nowhere"}, "thu")
		Eventually(dataUploadPhase(ctx, du)).Should(Equal(velerov2.DataUploadPhaseFailed))
		Expect(getDataUpload(ctx, du).Status.Message).To(Equal("backup storage location velero/nowhere not found"))
	})

	DescribeTable("fails and removes its temporaries when a step fails",
		func(ctx context.Context, inject func(*testVM), want string) {
			vm := newVM(ctx)
			loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
			inject(vm)
			du := newDataUpload(ctx, vm, loc, "fri")
			Eventually(dataUploadPhase(ctx, du)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseFailed))
			failed := getDataUpload(ctx, du)
			Expect(failed.Status.Message).To(MatchRegexp(want))
			Expect(failed.Status.CompletionTimestamp).NotTo(BeNil())
			expectTemporariesGone(ctx, du)
			Eventually(eventReasons(ctx, du)).Should(ContainElement("Failed"))
			idx, err := loc.repository().Index(ctx, vm.catalogVM())
			if err == nil {
				for _, c := range idx.Checkpoints {
					Expect(c.IsComplete()).To(BeFalse(), "checkpoint %s", c.ID)
				}
			}
		},
		Entry("KubeVirt's backup fails", func(vm *testVM) {
			kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.failWith = "guest agent did not thaw in time" })
		}, `^VirtualMachineBackup vms-\d+/kubevirt-backup-fri-vms-\d+ failed: guest agent did not thaw in time$`),
		Entry("the upload pod fails", func(vm *testVM) {
			kubelet.failPods(vm.namespace, "connection reset by peer")
		}, `^upload pod velero/kubevirt-backup-fri-vms-\d+ failed: connection reset by peer$`),
		Entry("KubeVirt's file is no qcow2 image", func(vm *testVM) {
			kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.corrupt = true })
		}, `^upload pod velero/kubevirt-backup-fri-vms-\d+ failed: upload volume rootdisk: disk db-rootdisk of checkpoint .*: Image is not in qcow2 format$`),
	)

	DescribeTable("cancels on spec.cancel and removes its temporaries",
		func(ctx context.Context, holdAt func(*testVM), phaseBefore velerov2.DataUploadPhase) {
			vm := newVM(ctx)
			loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
			holdAt(vm)
			du := newDataUpload(ctx, vm, loc, "sat")
			Eventually(dataUploadPhase(ctx, du)).WithTimeout(2 * time.Minute).Should(Equal(phaseBefore))
			if phaseBefore == velerov2.DataUploadPhaseInProgress {
				By("the upload pod running in Velero's namespace on the backup's volume, with the location's own secret")
				pod := &corev1.Pod{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: veleroNamespace, Name: temporaryName(du)}, pod)).To(Succeed())
				Expect(pod.Spec.Volumes).To(ContainElements(
					HaveField("VolumeSource.Secret.SecretName", credentialsName),
					HaveField("VolumeSource.PersistentVolumeClaim", HaveValue(HaveField("ReadOnly", BeTrue())))))
				claim := &corev1.PersistentVolumeClaim{}
				Expect(k8s.Get(ctx, client.ObjectKey{Namespace: veleroNamespace, Name: temporaryName(du)}, claim)).To(Succeed())
				pv := &corev1.PersistentVolume{}
				Expect(k8s.Get(ctx, client.ObjectKey{Name: claim.Spec.VolumeName}, pv)).To(Succeed())
				Expect(pv.Spec.ClaimRef.Namespace).To(Equal(veleroNamespace))
				Expect(gone(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: vm.namespace, Name: temporaryName(du)}})()).To(BeTrue())
				expectNoCredentials(ctx, vm.namespace)
			}
			updateDataUpload(ctx, du, func(d *velerov2.DataUpload) { d.Spec.Cancel = true })
			Eventually(dataUploadPhase(ctx, du)).Should(Equal(velerov2.DataUploadPhaseCanceled))
			Expect(getDataUpload(ctx, du).Status.Message).To(Equal("canceled"))
			expectTemporariesGone(ctx, du)
			Eventually(eventReasons(ctx, du)).Should(ContainElements("Canceling", "Canceled"))
		},
		Entry("while KubeVirt writes the backup", func(vm *testVM) {
			kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = true })
		}, velerov2.DataUploadPhaseAccepted),
		Entry("while the upload pod runs", func(vm *testVM) {
			kubelet.holdPods(vm.namespace, true)
		}, velerov2.DataUploadPhaseInProgress),
	)

	It("fails when spec.operationTimeout passes", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = true })
		du := newDataUpload(ctx, vm, loc, "sun", func(d *velerov2.DataUpload) {
			d.Spec.OperationTimeout = metav1.Duration{Duration: 3 * time.Second}
		})
		Eventually(gone(ctx, vmBackupOf(du))).Should(BeFalse())
		Eventually(dataUploadPhase(ctx, du)).WithTimeout(time.Minute).Should(Equal(velerov2.DataUploadPhaseFailed))
		Expect(getDataUpload(ctx, du).Status.Message).To(Equal("timed out after 3s in phase Accepted"))
		expectTemporariesGone(ctx, du)
	})

	It("backs up to an HTTPS store through the location's caCert, and names the x509 error without it", func(ctx context.Context) {
		srv, err := s3server.StartTLS(ctx, s3Binary, GinkgoT().TempDir())
		framework.Require(err, "the S3 server (versitygw) over HTTPS")
		DeferCleanup(srv.Stop)

		By("a location holding the authority that signed the server's certificate")
		vm := newVM(ctx)
		loc := newLocationOn(ctx, srv, velerov1.BackupStorageLocationPhaseAvailable, srv.CACert)
		du := newDataUpload(ctx, vm, loc, "mon")
		Eventually(dataUploadPhase(ctx, du)).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		idx, err := loc.repository().Index(ctx, vm.catalogVM())
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(1))
		Expect(idx.Checkpoints[0].IsComplete()).To(BeTrue())

		By("a location without it")
		other := newVM(ctx)
		untrusted := newLocationOn(ctx, srv, velerov1.BackupStorageLocationPhaseAvailable, nil)
		du = newDataUpload(ctx, other, untrusted, "tue")
		Eventually(dataUploadMessage(ctx, du)).WithTimeout(time.Minute).Should(And(
			HavePrefix("waiting: plan the backup of "+other.namespace+"/db: "),
			ContainSubstring("x509: certificate signed by unknown authority"),
			ContainSubstring("spec.objectStorage.caCert")))
		Expect(getDataUpload(ctx, du).Status.Phase).To(Equal(velerov2.DataUploadPhaseAccepted))
		updateDataUpload(ctx, du, func(d *velerov2.DataUpload) { d.Spec.Cancel = true })
		Eventually(dataUploadPhase(ctx, du)).WithTimeout(time.Minute).Should(Equal(velerov2.DataUploadPhaseCanceled))
	})
})

func must[T any](v T, err error) T {
	Expect(err).NotTo(HaveOccurred())
	return v
}
