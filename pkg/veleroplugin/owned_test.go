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
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

var _ = Describe("the owned-items restore action", func() {
	var action *veleroplugin.OwnedRestoreAction
	BeforeEach(func() { action = veleroplugin.NewOwnedRestoreAction(log) })

	pod := func(app string) *corev1.Pod {
		p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-db-x7k2p", Namespace: "prod"}}
		if app != "" {
			p.Labels = map[string]string{kubevirtv1.AppLabel: app}
		}
		return p
	}
	vmi := func(owner *metav1.OwnerReference) *kubevirtv1.VirtualMachineInstance {
		v := &kubevirtv1.VirtualMachineInstance{
			TypeMeta:   metav1.TypeMeta{APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: "VirtualMachineInstance"},
			ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"},
		}
		if owner != nil {
			v.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return v
	}
	controller := true
	ownedBy := func(kind string, isController bool) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: kubevirtv1.SchemeGroupVersion.String(), Kind: kind, Name: "db",
			UID: "vm-uid", Controller: &isController}
	}

	It("applies to pods and VMIs", func() {
		Expect(action.Name()).To(Equal("kubevirt-datamover.io/vm-owned-restore"))
		s, err := action.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(s.IncludedResources).To(ConsistOf("pods", "virtualmachineinstances.kubevirt.io"))
	})

	DescribeTable("keeps out of the restore what KubeVirt makes for a VM", func(obj runtime.Object) {
		out, err := action.Execute(restoreInput(item(obj)))
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeTrue())
	},
		Entry("a virt-launcher pod", pod("virt-launcher")),
		Entry("an attachment pod of hotplugged volumes", pod("hotplug-disk")),
		Entry("a VM's VMI", vmi(ownedBy("VirtualMachine", controller))),
	)

	DescribeTable("restores the rest as it is", func(obj runtime.Object) {
		in := restoreInput(item(obj))
		out, err := action.Execute(in)
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeFalse())
		Expect(out.UpdatedItem).To(BeIdenticalTo(in.Item))
	},
		Entry("a pod of the user's", pod("")),
		Entry("a pod of another KubeVirt component", pod("virt-exportserver")),
		Entry("a VMI no VM owns", vmi(nil)),
		Entry("a VMI whose controller is not a VM", vmi(ownedBy("VirtualMachineInstanceReplicaSet", controller))),
		Entry("a VMI a VM owns without controlling it", vmi(ownedBy("VirtualMachine", !controller))),
	)
})
