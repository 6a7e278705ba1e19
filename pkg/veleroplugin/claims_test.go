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
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

// boundClaim is claim prod/name as the PV controller left it, bound to
// volume pv-<name>.
func boundClaim(name string) *corev1.PersistentVolumeClaim {
	class, block := "fast", corev1.PersistentVolumeBlock
	return &corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "prod", Annotations: map[string]string{
			"pv.kubernetes.io/bind-completed":          "yes",
			"pv.kubernetes.io/bound-by-controller":     "yes",
			"volume.kubernetes.io/storage-provisioner": "csi.example.com",
		}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			VolumeMode:       &block,
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}},
			VolumeName:       "pv-" + name,
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
}

// boundVolume is the volume of boundClaim(claim).
func boundVolume(claim string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + claim},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: "prod", Name: claim},
		},
	}
}

// backUp runs the claim backup action on obj as Velero does.
func backUp(action *veleroplugin.ClaimBackupAction, obj runtime.Object, backup *velerov1.Backup) *unstructured.Unstructured {
	out, extra, opID, post, err := action.Execute(item(obj), backup)
	Expect(err).NotTo(HaveOccurred())
	Expect([]any{extra, opID, post}).To(Equal([]any{[]velero.ResourceIdentifier(nil), "", []velero.ResourceIdentifier(nil)}), "no operation, no items")
	return out.(*unstructured.Unstructured)
}

var _ = Describe("the claim backup action", func() {
	var (
		vm     *kubevirtv1.VirtualMachine
		action *veleroplugin.ClaimBackupAction
	)
	BeforeEach(func() {
		vm = runningVM()
		action = veleroplugin.NewClaimBackupAction(newClient(interceptor.Funcs{}, vm), log)
	})

	It("applies to claims and volumes", func() {
		Expect(action.Name()).To(Equal("kubevirt-datamover.io/pvc-backup"))
		s, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(s.IncludedResources).To(ConsistOf("persistentvolumeclaims", "persistentvolumes"))
	})

	It("marks the claims of a running VM's disks and their volumes, keeping the rest of the item", func() {
		for _, claim := range []string{"db-root", "db-data"} {
			u := backUp(action, boundClaim(claim), kubevirtBackup())
			Expect(u.GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationDiskOf, "prod/db"), claim)
			Expect(nestedString(u, "spec", "volumeName")).To(Equal("pv-"+claim), "the backup keeps the claim as it is")
			Expect(nestedString(u, "spec", "fieldFromTheFuture")).To(Equal("kept"))
			pv := backUp(action, boundVolume(claim), kubevirtBackup())
			Expect(pv.GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationDiskOf, "prod/db"), claim)
		}
	})

	It("marks KubeVirt's persistent state claim of such a VM and its volume", func() {
		state := boundClaim("persistent-state-for-db-x7k2p")
		state.Labels = map[string]string{"persistent-state-for": "db"}
		action = veleroplugin.NewClaimBackupAction(newClient(interceptor.Funcs{}, vm, state), log)
		u := backUp(action, state, kubevirtBackup())
		Expect(u.GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationStateOf, "prod/db"))
		Expect(u.GetAnnotations()).NotTo(HaveKey(veleroplugin.AnnotationDiskOf))
		pv := backUp(action, boundVolume(state.Name), kubevirtBackup())
		Expect(pv.GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationStateOf, "prod/db"))

		By("not the state claim of another VM")
		state.Labels["persistent-state-for"] = "web"
		action = veleroplugin.NewClaimBackupAction(newClient(interceptor.Funcs{}, vm, state), log)
		Expect(backUp(action, state, kubevirtBackup()).GetAnnotations()).NotTo(HaveKey(veleroplugin.AnnotationStateOf))
	})

	DescribeTable("leaves what the data mover does not save unmarked",
		func(obj client.Object, change func(*kubevirtv1.VirtualMachine, *velerov1.Backup)) {
			b := kubevirtBackup()
			change(vm, b)
			action = veleroplugin.NewClaimBackupAction(newClient(interceptor.Funcs{}, vm), log)
			// A mark the live object carries, from whatever source, never
			// reaches a backup that does not take the claim.
			obj.SetAnnotations(map[string]string{veleroplugin.AnnotationDiskOf: "prod/old"})
			u := backUp(action, obj, b)
			Expect(u.GetAnnotations()).NotTo(HaveKey(veleroplugin.AnnotationDiskOf))
		},
		Entry("a claim of no VM", boundClaim("logs"), func(*kubevirtv1.VirtualMachine, *velerov1.Backup) {}),
		Entry("a claim of a stopped VM", boundClaim("db-root"), func(vm *kubevirtv1.VirtualMachine, _ *velerov1.Backup) {
			vm.Status.PrintableStatus = kubevirtv1.VirtualMachineStatusStopped
		}),
		Entry("a claim of a VM of another namespace", boundClaim("db-root"), func(vm *kubevirtv1.VirtualMachine, _ *velerov1.Backup) {
			vm.Namespace = "dev"
		}),
		Entry("a volume of no claim", func() client.Object { v := boundVolume("db-root"); v.Spec.ClaimRef = nil; return v }(),
			func(*kubevirtv1.VirtualMachine, *velerov1.Backup) {}),
	)

	DescribeTable("leaves the items of backups it takes no part in as they are",
		func(change func(*velerov1.Backup)) {
			b := kubevirtBackup()
			change(b)
			in := item(boundClaim("db-root"))
			out, _, _, _, err := action.Execute(in, b)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal(in))
			Expect(out.(*unstructured.Unstructured).GetAnnotations()).NotTo(HaveKey(veleroplugin.AnnotationDiskOf))
		},
		Entry("another data mover", func(b *velerov1.Backup) { b.Spec.DataMover = "velero" }),
		Entry("a finalizing backup", func(b *velerov1.Backup) { b.Status.Phase = velerov1.BackupPhaseFinalizing }),
	)

	It("retries a list the API server could not answer, and fails the item with a list that keeps failing", func() {
		fails := 1
		list := func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if fails > 0 {
				fails--
				return errors.New("connection reset")
			}
			return c.List(ctx, l, opts...)
		}
		action = veleroplugin.NewClaimBackupAction(newClient(interceptor.Funcs{List: list}, vm), log)
		Expect(backUp(action, boundClaim("db-root"), kubevirtBackup()).GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationDiskOf, "prod/db"))

		fails = 100
		_, _, _, _, err := action.Execute(item(boundClaim("db-root")), kubevirtBackup())
		Expect(err).To(MatchError(And(ContainSubstring("list VirtualMachines of namespace prod"), ContainSubstring("connection reset"))))
	})
})

var _ = Describe("the claim restore action", func() {
	var action *veleroplugin.ClaimRestoreAction
	BeforeEach(func() { action = veleroplugin.NewClaimRestoreAction(log) })

	// marked is obj as the claim backup action left it in the backup.
	marked := func(obj runtime.Object) *unstructured.Unstructured {
		u := item(obj)
		u.SetAnnotations(map[string]string{veleroplugin.AnnotationDiskOf: "prod/db"})
		if claim, ok := obj.(*corev1.PersistentVolumeClaim); ok {
			a := u.GetAnnotations()
			for k, v := range claim.Annotations {
				a[k] = v
			}
			u.SetAnnotations(a)
		}
		return u
	}

	It("applies to claims and volumes", func() {
		Expect(action.Name()).To(Equal("kubevirt-datamover.io/pvc-restore"))
		s, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(s.IncludedResources).To(ConsistOf("persistentvolumeclaims", "persistentvolumes"))
	})

	It("restores a marked claim unbound, selecting a dynamic-pv-restore label of its target namespace, as Velero's CSI action does", func() {
		in := restoreInput(marked(boundClaim("db-root")))
		out, err := action.Execute(in)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeFalse())
		Expect(out.OperationID).To(BeEmpty())
		pvc := &corev1.PersistentVolumeClaim{}
		Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(out.UpdatedItem.UnstructuredContent(), pvc)).To(Succeed())
		Expect(pvc.Spec.VolumeName).To(BeEmpty())
		Expect(pvc.Spec.Selector.MatchLabels).To(HaveKeyWithValue(velerov1.DynamicPVRestoreLabel, MatchRegexp(`^staging\.db-root\.[a-z0-9]{5}$`)))
		Expect(pvc.Annotations).To(Equal(map[string]string{"volume.kubernetes.io/storage-provisioner": "csi.example.com"}),
			"binding annotations and the mark dropped")
		want := boundClaim("db-root").Spec
		Expect([]any{*pvc.Spec.StorageClassName, pvc.Spec.Resources, pvc.Spec.AccessModes, *pvc.Spec.VolumeMode}).To(
			Equal([]any{*want.StorageClassName, want.Resources, want.AccessModes, *want.VolumeMode}), "class, size and modes kept")
		Expect(nestedString(out.UpdatedItem.(*unstructured.Unstructured), "spec", "fieldFromTheFuture")).To(Equal("kept"))
		Expect(in.Item.(*unstructured.Unstructured).GetAnnotations()).To(HaveKey(veleroplugin.AnnotationDiskOf), "Velero's item not changed in place")

		again, err := action.Execute(restoreInput(marked(boundClaim("db-root"))))
		Expect(err).NotTo(HaveOccurred())
		Expect(nestedString(again.UpdatedItem.(*unstructured.Unstructured), "spec", "selector", "matchLabels", velerov1.DynamicPVRestoreLabel)).NotTo(
			Equal(pvc.Spec.Selector.MatchLabels[velerov1.DynamicPVRestoreLabel]), "each restore selects a label of its own")
	})

	It("keeps the claim's own selector beside Velero's label", func() {
		claim := boundClaim("db-root")
		claim.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}
		out, err := action.Execute(restoreInput(marked(claim)))
		Expect(err).NotTo(HaveOccurred())
		labels, _, err := unstructured.NestedStringMap(out.UpdatedItem.UnstructuredContent(), "spec", "selector", "matchLabels")
		Expect(err).NotTo(HaveOccurred())
		Expect(labels).To(HaveKeyWithValue("tier", "db"))
		Expect(labels).To(HaveKey(velerov1.DynamicPVRestoreLabel))
	})

	It("does not restore the volume of a marked claim", func() {
		out, err := action.Execute(restoreInput(marked(boundVolume("db-root"))))
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeTrue())
	})

	It("does not restore KubeVirt's persistent state claim of a VM, nor its volume: KubeVirt makes it anew", func() {
		for _, obj := range []runtime.Object{boundClaim("persistent-state-for-db-x7k2p"), boundVolume("persistent-state-for-db-x7k2p")} {
			u := item(obj)
			u.SetAnnotations(map[string]string{veleroplugin.AnnotationStateOf: "prod/db"})
			out, err := action.Execute(restoreInput(u))
			Expect(err).NotTo(HaveOccurred())
			Expect(out.SkipRestore).To(BeTrue())
		}
	})

	It("leaves claims and volumes it did not mark to Velero", func() {
		for _, obj := range []runtime.Object{boundClaim("logs"), boundVolume("logs")} {
			in := restoreInput(item(obj))
			out, err := action.Execute(in)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal(&velero.RestoreItemActionExecuteOutput{UpdatedItem: in.Item}))
		}
	})

	It("restores marked items as Velero would without it when the restore restores no volumes, the mark dropped", func() {
		no := false
		for _, obj := range []runtime.Object{boundClaim("db-root"), boundVolume("db-root")} {
			in := restoreInput(marked(obj))
			in.Restore.Spec.RestorePVs = &no
			out, err := action.Execute(in)
			Expect(err).NotTo(HaveOccurred())
			Expect(out.SkipRestore).To(BeFalse())
			want := item(obj)
			if len(want.GetAnnotations()) == 0 {
				want.SetAnnotations(map[string]string{})
			}
			Expect(out.UpdatedItem).To(Equal(want))
		}
	})

	It("has no operations", func() {
		_, err := action.Progress("", &velerov1.Restore{})
		Expect(err).To(HaveOccurred())
		Expect(action.Cancel("", &velerov1.Restore{})).To(Succeed())
		ready, err := action.AreAdditionalItemsReady(nil, &velerov1.Restore{})
		Expect([]any{ready, err}).To(Equal([]any{true, nil}))
	})
})
