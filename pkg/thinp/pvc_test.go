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

package thinp_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

var _ = Describe("PVCExtender", func() {
	var (
		client *fake.Clientset
		ext    *thinp.PVCExtender
	)

	claim := func(request, capacity string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: "disk1"},
			Spec: corev1.PersistentVolumeClaimSpec{
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(request)}},
			},
			Status: corev1.PersistentVolumeClaimStatus{
				Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(capacity)},
			},
		}
	}

	// resizer plays the storage driver: once the request grew, the next
	// read of the claim shows the requested capacity.
	resizer := func() {
		client.PrependReactor("get", "persistentvolumeclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
			obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), "vms", "disk1")
			if err != nil {
				return true, nil, err
			}
			c := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
			c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: c.Spec.Resources.Requests[corev1.ResourceStorage]}
			Expect(client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), c, "vms")).To(Succeed())
			return true, c, nil
		})
	}

	patches := func() []string {
		var p []string
		for _, a := range client.Actions() {
			if patch, ok := a.(k8stesting.PatchAction); ok {
				p = append(p, string(patch.GetPatch()))
			}
		}
		return p
	}

	BeforeEach(func() {
		client = fake.NewClientset(claim("1Gi", "1Gi"))
		ext = &thinp.PVCExtender{Client: client, Namespace: "vms", Name: "disk1", PollInterval: time.Millisecond}
	})

	It("raises the claim's request and returns the capacity the driver reports", func() {
		resizer()
		size, err := ext.Extend(context.Background(), 2*gib)
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(Equal(2 * gib))
		Expect(patches()).To(Equal([]string{`{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`}))
	})

	It("does not patch a claim that requests enough already", func() {
		client = fake.NewClientset(claim("3Gi", "3Gi"))
		ext.Client = client
		size, err := ext.Extend(context.Background(), 2*gib)
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(Equal(3 * gib))
		Expect(patches()).To(BeEmpty())
	})

	It("waits for the capacity until the context ends", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		DeferCleanup(cancel)
		_, err := ext.Extend(ctx, 2*gib)
		Expect(err).To(MatchError(ContainSubstring("extend claim vms/disk1 to 2Gi: wait for capacity (now 1073741824 bytes)")))
		Expect(err).To(MatchError(context.DeadlineExceeded))
	})

	It("names a missing claim", func() {
		ext.Name = "gone"
		_, err := ext.Extend(context.Background(), gib)
		Expect(err).To(MatchError(ContainSubstring(`extend claim vms/gone: persistentvolumeclaims "gone" not found`)))
	})
})
