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

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The suites that test admission and controllers rely on these properties of
// the envtest API server.
var _ = Describe("envtest API server", Ordered, func() {
	var server *framework.APIServer

	BeforeAll(func() {
		var err error
		server, err = framework.StartAPIServer(filepath.Join("testdata", "widgets.yaml"))
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
