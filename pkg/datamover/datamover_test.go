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
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

var _ = Describe("snapshot IDs", func() {
	It("carry the backup and the VM to the restore", func() {
		b, ns, vm, err := ParseSnapshotID(SnapshotID("tue", "prod", "db"))
		Expect(err).NotTo(HaveOccurred())
		Expect([]string{b, ns, vm}).To(Equal([]string{"tue", "prod", "db"}))
	})

	DescribeTable("refuse what another data mover wrote",
		func(id string) {
			_, _, _, err := ParseSnapshotID(id)
			Expect(err).To(MatchError(ContainSubstring("want <backup>/<vm namespace>/<vm name>")))
		},
		Entry("a kopia snapshot", "f8b5c2a1"),
		Entry("an empty part", "tue//db"),
		Entry("too many parts", "tue/prod/db/vda"),
	)
})

var _ = Describe("what a DataUpload stores", func() {
	du := func(labels, annotations map[string]string) *velerov2.DataUpload {
		return &velerov2.DataUpload{
			ObjectMeta: metav1.ObjectMeta{Name: "du-1", Labels: labels, Annotations: annotations},
			Spec:       velerov2.DataUploadSpec{SourceNamespace: "prod"},
		}
	}

	It("is the backup of Velero's label and the VM of the annotations", func() {
		b, vm, err := UploadTarget(du(map[string]string{LabelBackupName: "tue"},
			map[string]string{AnnotationVMName: "db", AnnotationBackupName: "ignored"}))
		Expect(err).NotTo(HaveOccurred())
		Expect(b).To(Equal("tue"))
		Expect(vm).To(Equal(catalog.VM{Namespace: "prod", Name: "db"}))
	})

	It("needs a VM", func() {
		_, _, err := UploadTarget(du(nil, nil))
		Expect(err).To(MatchError(ContainSubstring(AnnotationVMName)))
	})

	DescribeTable("is a full backup when either force-full annotation says so",
		func(annotations map[string]string, want bool) {
			r := &DataUploadReconciler{}
			j := &uploadJob{du: du(nil, annotations)}
			opts, err := r.planOptions(j, &kubevirtbackup.VMBackupTracker{})
			Expect(err).NotTo(HaveOccurred())
			Expect(opts.ForceFull).To(Equal(want))
		},
		Entry("OADP's name", map[string]string{AnnotationForceFull: "true"}, true),
		Entry("the name of earlier releases", map[string]string{AnnotationForceFullLegacy: "true"}, true),
		Entry("OADP's name, in another case", map[string]string{AnnotationForceFull: "TRUE"}, true),
		Entry("neither", map[string]string{AnnotationForceFull: "false"}, false),
	)
})

var _ = Describe("the disks of a VM", func() {
	It("are its volumes backed by a claim or a DataVolume, in order", func() {
		vm := &kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			Spec: kubevirtv1.VirtualMachineInstanceSpec{Volumes: []kubevirtv1.Volume{
				{Name: "root", VolumeSource: kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: "db-root"}}},
				{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{}}},
				{Name: "data", VolumeSource: kubevirtv1.VolumeSource{PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{
					PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{ClaimName: "db-data"}}}},
			}},
		}}}
		Expect(DiskClaims(vm)).To(Equal([]mover.Disk{{Volume: "root", Name: "db-root"}, {Volume: "data", Name: "db-data"}}))
		Expect(DiskClaims(&kubevirtv1.VirtualMachine{})).To(BeEmpty())
	})
})

var _ = Describe("childName", func() {
	It("keeps short names readable", func() {
		Expect(childName("kubevirt-backup", "tue-x7k2p")).To(Equal("kubevirt-backup-tue-x7k2p"))
	})

	It("shortens long names to a DNS label, distinctly", func() {
		a := childName("kubevirt-backup", strings.Repeat("a", 70)+"-1")
		b := childName("kubevirt-backup", strings.Repeat("a", 70)+"-2")
		Expect(len(a)).To(BeNumerically("<=", 63))
		Expect(a).NotTo(Equal(b))
	})
})

var _ = Describe("the temporary volume", func() {
	DescribeTable("holds the disks with room for qcow2 metadata",
		func(sizes []string, want string) {
			var disks []vmDisk
			for _, s := range sizes {
				disks = append(disks, vmDisk{Size: resource.MustParse(s)})
			}
			size := backupVolumeSize(disks)
			Expect(size.String()).To(Equal(want))
		},
		Entry("one 10 GiB disk", []string{"10Gi"}, "10407Mi"),
		Entry("two disks", []string{"1Gi", "512Mi"}, "1616Mi"),
	)

	It("records the disks on the backup and reads them back", func() {
		disks := []vmDisk{
			{Disk: mover.Disk{Volume: "rootdisk", Name: "db-root"}, Size: resource.MustParse("10Gi")},
			{Disk: mover.Disk{Volume: "data", Name: "db-data"}, Size: resource.MustParse("1Gi")},
		}
		got, sizes, err := parseDisks(formatDisks(disks))
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal([]mover.Disk{disks[0].Disk, disks[1].Disk}))
		Expect(sizes).To(Equal(map[string]string{"db-root": "10Gi", "db-data": "1Gi"}))
	})
})

var _ = Describe("pods", func() {
	DescribeTable("report their outcome through the termination message",
		func(phase corev1.PodPhase, term *corev1.ContainerStateTerminated, finished, succeeded bool, msg string) {
			pod := &corev1.Pod{Status: corev1.PodStatus{Phase: phase, Message: "evicted"}}
			if term != nil {
				pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: PodContainer, State: corev1.ContainerState{Terminated: term}}}
			}
			f, s, m := podOutcome(pod)
			Expect([]any{f, s, m}).To(Equal([]any{finished, succeeded, msg}))
		},
		Entry("running", corev1.PodRunning, nil, false, false, ""),
		Entry("succeeded", corev1.PodSucceeded, &corev1.ContainerStateTerminated{Message: `{"checkpoint":"c"}`}, true, true, `{"checkpoint":"c"}`),
		Entry("failed with a message", corev1.PodFailed, &corev1.ContainerStateTerminated{Message: "no space left"}, true, false, "no space left"),
		Entry("killed", corev1.PodFailed, &corev1.ContainerStateTerminated{Reason: "OOMKilled"}, true, false, "OOMKilled"),
		Entry("evicted before it ran", corev1.PodFailed, nil, true, false, "evicted"),
	)

	It("write a restore onto a block device or into disk.img", func() {
		block := corev1.PersistentVolumeBlock
		cfg := &Config{}
		cfg.defaults()
		fs := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "t"}}
		dev := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "t"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: &block}}
		Expect(restoreTarget(fs)).To(Equal("/var/lib/datamover/target/disk.img"))
		Expect(restoreTarget(dev)).To(Equal(PodTargetDevice))
		Expect(cfg.restorePod(metav1.ObjectMeta{}, &location{}, dev, nil, nil).Spec.Containers[0].VolumeDevices).To(HaveLen(1))
		Expect(cfg.restorePod(metav1.ObjectMeta{}, &location{}, fs, nil, nil).Spec.Containers[0].VolumeDevices).To(BeEmpty())
	})
})

var _ = Describe("per-VM serialization", func() {
	du := func(name string, age time.Duration, vm string, phase velerov2.DataUploadPhase) *velerov2.DataUpload {
		return &velerov2.DataUpload{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "velero",
				CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC).Add(-age)),
				Annotations:       map[string]string{AnnotationVMName: vm, AnnotationVMNamespace: "prod"}},
			Spec:   velerov2.DataUploadSpec{DataMover: DataMover},
			Status: velerov2.DataUploadStatus{Phase: phase},
		}
	}

	DescribeTable("lets the oldest live backup of a VM go first",
		func(others []*velerov2.DataUpload, want string) {
			scheme, err := NewScheme()
			Expect(err).NotTo(HaveOccurred())
			self := du("self", time.Hour, "db", velerov2.DataUploadPhaseAccepted)
			objs := []client.Object{self}
			for _, o := range others {
				objs = append(objs, o)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
				WithIndex(&velerov2.DataUpload{}, indexVM, vmIndexValue).Build()
			r := &DataUploadReconciler{Client: c}
			got, err := r.aheadInLine(context.Background(), &uploadJob{du: self, vm: catalog.VM{Namespace: "prod", Name: "db"}})
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("alone", nil, ""),
		Entry("behind an older live one", []*velerov2.DataUpload{
			du("older", 2*time.Hour, "db", velerov2.DataUploadPhaseInProgress),
			du("oldest", 3*time.Hour, "db", velerov2.DataUploadPhaseAccepted),
		}, "oldest"),
		Entry("not behind finished ones", []*velerov2.DataUpload{
			du("done", 2*time.Hour, "db", velerov2.DataUploadPhaseCompleted),
			du("failed", 3*time.Hour, "db", velerov2.DataUploadPhaseFailed),
			du("canceled", 4*time.Hour, "db", velerov2.DataUploadPhaseCanceled),
		}, ""),
		Entry("not behind younger ones", []*velerov2.DataUpload{du("younger", time.Minute, "db", velerov2.DataUploadPhaseInProgress)}, ""),
		Entry("not behind another VM's", []*velerov2.DataUpload{du("other", 2*time.Hour, "web", velerov2.DataUploadPhaseInProgress)}, ""),
		Entry("by name among equals", []*velerov2.DataUpload{du("a-same-age", time.Hour, "db", velerov2.DataUploadPhaseNew)}, "a-same-age"),
	)
})
