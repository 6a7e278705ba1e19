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

package apiserver_test

import (
	"context"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The suites that test admission and controllers rely on these properties of
// the envtest API server.
var _ = Describe("envtest API server", Ordered, func() {
	var server *apiserver.Server

	BeforeAll(func(ctx SpecContext) {
		var err error
		server, err = apiserver.Start(ctx, filepath.Join("testdata", "widgets.yaml"))
		framework.Require(err, "kube-apiserver and etcd")
		DeferCleanup(server.Stop)
	})

	It("serves the core API", func() {
		client, err := kubernetes.NewForConfig(server.Config)
		Expect(err).ToNot(HaveOccurred())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"}}
		_, err = client.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{})
		Expect(err).ToNot(HaveOccurred())
		got, err := client.CoreV1().ConfigMaps("default").Get(context.Background(), "probe", metav1.GetOptions{})
		Expect(err).ToNot(HaveOccurred())
		Expect(got.Data).To(HaveKeyWithValue("k", "v"))
	})

	It("installs CRDs and prunes fields their schema does not name", func() {
		client, err := dynamic.NewForConfig(server.Config)
		Expect(err).ToNot(HaveOccurred())
		widgets := client.Resource(schema.GroupVersionResource{Group: "test.kubevirt-qcow2.io", Version: "v1", Resource: "widgets"}).Namespace("default")
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "test.kubevirt-qcow2.io/v1",
			"kind":       "Widget",
			"metadata":   map[string]any{"name": "w"},
			"spec":       map[string]any{"size": int64(3), "unknown": "dropped"},
		}}
		_, err = widgets.Create(context.Background(), obj, metav1.CreateOptions{})
		Expect(err).ToNot(HaveOccurred())
		got, err := widgets.Get(context.Background(), "w", metav1.GetOptions{})
		Expect(err).ToNot(HaveOccurred())
		Expect(got.Object["spec"]).To(Equal(map[string]any{"size": int64(3)}))
	})
})
