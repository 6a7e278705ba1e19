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

package deploy_test

import (
	"context"
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

var _ = Describe("deploy/examples", Ordered, func() {
	var (
		ctx = context.Background()
		c   client.Client
		// returned holds each example as the API server would store it.
		returned   = map[string]*unstructured.Unstructured{}
		hotplugErr error
	)

	BeforeAll(func() {
		s := runtime.NewScheme()
		Expect(clientgoscheme.AddToScheme(s)).To(Succeed())
		Expect(extv1.AddToScheme(s)).To(Succeed())
		var err error
		c, err = client.New(apiConfig, client.Options{Scheme: s})
		Expect(err).ToNot(HaveOccurred())
		objs := framework.Render("examples")
		// The namespace for real, so that the rest can be dry-run in it.
		Expect(objs[0].GetKind()).To(Equal("Namespace"))
		Expect(c.Create(ctx, objs[0].DeepCopy())).To(Succeed())
		// The hotplug example needs the containerDisk hotplug patches in
		// the tree; its spec says so when they are not.
		hotplugErr = hotplugAPI(ctx, c)
		// Server-side dry run: nothing runs VMs or binds claims here, but
		// the API server validates every field against the patched CRDs
		// and refuses any field they do not know.
		for _, o := range objs[1:] {
			if o.GetName() == "containerdisk-hotplug" && hotplugErr != nil {
				continue
			}
			obj := o.DeepCopy()
			Expect(obj.GetNamespace()).To(Equal("qcow2-examples"))
			Expect(c.Create(ctx, obj, client.DryRunAll, client.FieldValidation("Strict"))).
				To(Succeed(), "dry-run create %s %s", obj.GetKind(), obj.GetName())
			returned[obj.GetKind()+"/"+obj.GetName()] = obj
		}
	})

	DescribeTable("the API server keeps each feature's fields",
		func(vm string, volume int, path []string, want any) {
			if vm == "containerdisk-hotplug" {
				framework.Require(hotplugErr, "the patched KubeVirt tree's containerDisk hotplug API (patch 0015)")
			}
			obj, ok := returned["VirtualMachine/"+vm]
			Expect(ok).To(BeTrue(), "example VM %s", vm)
			volumes, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "volumes")
			Expect(err).ToNot(HaveOccurred())
			Expect(len(volumes)).To(BeNumerically(">", volume))
			got, found, err := unstructured.NestedFieldNoCopy(volumes[volume].(map[string]any), path...)
			Expect(err).ToNot(HaveOccurred())
			Expect(found).To(BeTrue(), "%v in %s", path, vm)
			Expect(got).To(Equal(want))
		},
		Entry("ephemeral overlay", "overlay-ephemeral", 0, []string{"overlay", "backingPVC", "claimName"}, "golden-fedora"),
		Entry("persistent overlay", "overlay-persistent", 0, []string{"overlay", "persistent"}, true),
		Entry("persistent overlay target", "overlay-persistent", 0, []string{"overlay", "targetPVC", "claimName"}, "overlay-persistent-delta"),
		Entry("thin overlay's chunk", "overlay-thin", 0, []string{"overlay", "thinProvisioning", "chunkSize"}, "2Gi"),
		Entry("hotpluggable containerDisk", "containerdisk-hotplug", 1, []string{"containerDisk", "hotpluggable"}, true),
		Entry("hook sidecar's placeholder disk", "hook-sidecar", 0, []string{"emptyDisk", "capacity"}, "1Mi"),
	)

	It("asks for the hook sidecar with its image and claim", func() {
		obj := returned["VirtualMachine/hook-sidecar"]
		annotations, _, err := unstructured.NestedStringMap(obj.Object, "spec", "template", "metadata", "annotations")
		Expect(err).ToNot(HaveOccurred())
		Expect(annotations).To(HaveKeyWithValue("hooks.kubevirt.io/hookSidecars", And(
			ContainSubstring(`"image": "registry.example.com/kubevirt-qcow2/overlay-hook:dev"`),
			ContainSubstring(`"name": "hook-store"`))))
		Expect(annotations).To(HaveKeyWithValue("overlay.kubevirt-qcow2.io/disks", ContainSubstring(`"backing": "disk.img"`)))
	})
})

// hotplugAPI reports whether the installed VirtualMachine CRD knows a
// hotpluggable containerDisk.
func hotplugAPI(ctx context.Context, c client.Client) error {
	crd := &extv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: "virtualmachines.kubevirt.io"}, crd); err != nil {
		return err
	}
	for _, v := range crd.Spec.Versions {
		if v.Name != "v1" || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		s := v.Schema.OpenAPIV3Schema
		for _, p := range []string{"spec", "template", "spec", "volumes"} {
			next, ok := s.Properties[p]
			if !ok {
				return errors.New("no " + p + " in the VirtualMachine schema")
			}
			s = &next
		}
		if _, ok := s.Items.Schema.Properties["containerDisk"].Properties["hotpluggable"]; ok {
			return nil
		}
	}
	return errors.New("the VirtualMachine CRD has no containerDisk.hotpluggable")
}
