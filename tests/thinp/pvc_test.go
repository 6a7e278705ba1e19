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
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The PVCExtender against a real kube-apiserver and etcd. envtest runs no
// kubelet, controller-manager or CSI driver, so nothing would ever grow the
// volume: the specs play the resizer by writing status.capacity when the
// request grew. What is real is everything the API server decides: the
// merge patch of a bound claim's request, the PersistentVolumeClaimResize
// admission plugin (the StorageClass must allow expansion), validation
// (a request never shrinks) and the status subresource.
var _ = Describe("PVCExtender against kube-apiserver", Ordered, func() {
	const ns = "default"
	var client kubernetes.Interface

	BeforeAll(func(ctx SpecContext) {
		server, err := apiserver.Start(ctx)
		framework.Require(err, "kube-apiserver and etcd")
		DeferCleanup(server.Stop)
		client, err = kubernetes.NewForConfig(server.Config)
		Expect(err).ToNot(HaveOccurred())
		for name, expand := range map[string]bool{"expandable": true, "fixed": false} {
			_, err := client.StorageV1().StorageClasses().Create(context.Background(), &storagev1.StorageClass{
				ObjectMeta:           metav1.ObjectMeta{Name: name},
				Provisioner:          "block.example.com",
				AllowVolumeExpansion: ptr.To(expand),
			}, metav1.CreateOptions{})
			Expect(err).ToNot(HaveOccurred())
		}
	})

	// boundClaim creates a Block-mode claim of class with size requested,
	// bound to a volume of that size as a provisioner would leave it.
	boundClaim := func(ctx context.Context, name, class string, size int64) {
		q := *resource.NewQuantity(size, resource.BinarySI)
		_, err := client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: q},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode:                    ptr.To(corev1.PersistentVolumeBlock),
				StorageClassName:              class,
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
				PersistentVolumeSource: corev1.PersistentVolumeSource{
					CSI: &corev1.CSIPersistentVolumeSource{Driver: "block.example.com", VolumeHandle: name},
				},
			},
		}, metav1.CreateOptions{})
		Expect(err).ToNot(HaveOccurred())
		claim, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode:       ptr.To(corev1.PersistentVolumeBlock),
				StorageClassName: ptr.To(class),
				VolumeName:       "pv-" + name,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q}},
			},
		}, metav1.CreateOptions{})
		Expect(err).ToNot(HaveOccurred())
		claim.Status = corev1.PersistentVolumeClaimStatus{
			Phase:       corev1.ClaimBound,
			AccessModes: claim.Spec.AccessModes,
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: q},
		}
		_, err = client.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		Expect(err).ToNot(HaveOccurred())
	}

	// resize plays kubelet and the CSI resizer for claim name until ctx
	// ends: whenever the request is above the capacity, it takes a while,
	// then reports the requested capacity. It returns the capacities it
	// reported.
	resize := func(ctx context.Context, name string, delay time.Duration) <-chan []int64 {
		done := make(chan []int64, 1)
		go func() {
			defer GinkgoRecover()
			var reported []int64
			defer func() { done <- reported }()
			for ctx.Err() == nil {
				claim, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return
				}
				req := claim.Spec.Resources.Requests[corev1.ResourceStorage]
				capacity := claim.Status.Capacity[corev1.ResourceStorage]
				if req.Cmp(capacity) > 0 {
					time.Sleep(delay)
					claim.Status.Capacity[corev1.ResourceStorage] = req
					if _, err := client.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err == nil {
						reported = append(reported, req.Value())
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		return done
	}

	request := func(ctx context.Context, name string) int64 {
		claim, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		Expect(err).ToNot(HaveOccurred())
		q := claim.Spec.Resources.Requests[corev1.ResourceStorage]
		return q.Value()
	}

	It("grows a bound claim chunk by chunk, each time once the capacity is reported", func(ctx context.Context) {
		boundClaim(ctx, "grows", "expandable", gib)
		resizerCtx, stop := context.WithCancel(ctx)
		reported := resize(resizerCtx, "grows", 50*time.Millisecond)
		ext := &thinp.PVCExtender{Client: client, Namespace: ns, Name: "grows", PollInterval: 20 * time.Millisecond}
		for _, want := range []int64{gib + 256*mib, gib + 512*mib, 2 * gib} {
			got, err := ext.Extend(ctx, want)
			Expect(err).ToNot(HaveOccurred())
			Expect(got).To(Equal(want))
			Expect(request(ctx, "grows")).To(Equal(want))
		}
		stop()
		Expect(<-reported).To(Equal([]int64{gib + 256*mib, gib + 512*mib, 2 * gib}))
	}, SpecTimeout(time.Minute))

	It("never lowers the request of a claim that asks for more already", func(ctx context.Context) {
		boundClaim(ctx, "larger", "expandable", 3*gib)
		ext := &thinp.PVCExtender{Client: client, Namespace: ns, Name: "larger", PollInterval: 20 * time.Millisecond}
		got, err := ext.Extend(ctx, 2*gib)
		Expect(err).ToNot(HaveOccurred())
		Expect(got).To(Equal(3 * gib))
		Expect(request(ctx, "larger")).To(Equal(3 * gib))
	}, SpecTimeout(time.Minute))

	It("reports the API server's refusal when the StorageClass does not allow expansion", func(ctx context.Context) {
		boundClaim(ctx, "fixed", "fixed", gib)
		ext := &thinp.PVCExtender{Client: client, Namespace: ns, Name: "fixed", PollInterval: 20 * time.Millisecond}
		_, err := ext.Extend(ctx, 2*gib)
		Expect(err).To(MatchError(ContainSubstring("extend claim default/fixed to 2Gi")))
		Expect(err).To(MatchError(ContainSubstring("only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize")))
		Expect(request(ctx, "fixed")).To(Equal(gib))
	}, SpecTimeout(time.Minute))

	It("waits for the capacity until its context ends when nothing resizes the volume", func(ctx context.Context) {
		boundClaim(ctx, "stuck", "expandable", gib)
		ext := &thinp.PVCExtender{Client: client, Namespace: ns, Name: "stuck", PollInterval: 20 * time.Millisecond}
		waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := ext.Extend(waitCtx, 2*gib)
		Expect(err).To(MatchError(ContainSubstring("wait for capacity (now 1073741824 bytes)")))
		Expect(err).To(MatchError(context.DeadlineExceeded))
		Expect(request(ctx, "stuck")).To(Equal(2 * gib))
	}, SpecTimeout(time.Minute))
})
