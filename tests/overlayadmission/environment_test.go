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

package overlayadmission_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The suite runs KubeVirt's own code from the patched tree that `make test`
// assembles: the CRDs virt-operator installs and the admitters virt-api
// serves. Both tools are built inside that tree, with their sources mapped in
// through `go build -overlay`, so the tree itself is never written.
const (
	toolsPackage      = "tools/overlay-admission"
	kubeVirtNamespace = "kubevirt"
	kubeVirtName      = "kubevirt"
	testNamespace     = "default"
	overlayGate       = "OverlayVolumes"

	// Webhook paths as virt-api serves them (components.VMICreateValidatePath
	// and components.VMValidatePath), without the leading '/' that envtest
	// adds itself.
	vmiCreatePath = "virtualmachineinstances-validate-create"
	vmPath        = "virtualmachines-validate"

	vmiWebhookName = "virtualmachineinstances-create-validator.kubevirt-qcow2.io"
	vmWebhookName  = "virtualmachines-validator.kubevirt-qcow2.io"
)

var (
	vmiResource      = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	vmResource       = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	kubeVirtResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}
)

var client dynamic.Interface

var _ = BeforeSuite(func(ctx SpecContext) {
	framework.SetupLogger()
	tree := testenv.KubeVirtTree()
	_, err := os.Stat(filepath.Join(tree, "pkg", "storage", "admitters", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")

	work := GinkgoT().TempDir()
	bin := buildTools(work)

	crdDir := filepath.Join(work, "crds")
	run(filepath.Join(bin, "crds"), "--out", crdDir)

	server, err := apiserver.Start(ctx, crdDir)
	framework.Require(err, "kube-apiserver and etcd")
	DeferCleanup(server.Stop)

	client, err = dynamic.NewForConfig(server.Config)
	Expect(err).ToNot(HaveOccurred())
	createKubeVirt(server)

	hooks := &envtest.WebhookInstallOptions{
		LocalServingHost:   "127.0.0.1",
		ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{webhookConfiguration()},
	}
	Expect(hooks.PrepWithoutInstalling()).To(Succeed())
	DeferCleanup(hooks.Cleanup)

	user, err := server.Env.AddUser(envtest.User{Name: "virt-api", Groups: []string{"system:masters"}}, nil)
	Expect(err).ToNot(HaveOccurred())
	kubeconfig, err := user.KubeConfig()
	Expect(err).ToNot(HaveOccurred())
	kubeconfigPath := filepath.Join(work, "kubeconfig")
	Expect(os.WriteFile(kubeconfigPath, kubeconfig, 0o600)).To(Succeed())

	listen := net.JoinHostPort(hooks.LocalServingHost, strconv.Itoa(hooks.LocalServingPort))
	startWebhook(filepath.Join(bin, "webhook"), "--kubeconfig", kubeconfigPath, "--namespace", kubeVirtNamespace,
		"--listen", listen,
		"--tls-cert-file", filepath.Join(hooks.LocalServingCertDir, "tls.crt"),
		"--tls-key-file", filepath.Join(hooks.LocalServingCertDir, "tls.key"))
	Eventually(func() error {
		conn, err := tls.Dial("tcp", listen, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		return conn.Close()
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())

	Expect(hooks.Install(server.Config)).To(Succeed())
})

// buildTools builds both tools of testdata/ inside the tree in one go build,
// once per suite run; Go's build cache makes later runs link only.
func buildTools(work string) string {
	tools := map[string]string{}
	for _, tool := range []string{"crds", "webhook"} {
		source, err := filepath.Abs(filepath.Join("testdata", tool, "main.go"))
		Expect(err).ToNot(HaveOccurred())
		tools[toolsPackage+"/"+tool] = source
	}
	bin := filepath.Join(work, "bin")
	Expect(testenv.BuildInKubeVirtTree(context.Background(), tools, bin)).To(Succeed())
	return bin + string(filepath.Separator)
}

func run(name string, args ...string) {
	out, err := exec.Command(name, args...).CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), "%s: %s", filepath.Base(name), out)
}

func startWebhook(name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdout = GinkgoWriter
	cmd.Stderr = GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	DeferCleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		Eventually(exited).WithTimeout(30 * time.Second).Should(Receive())
	})
}

// webhookConfiguration registers the VMI create and the VM admitters the way
// virt-operator does for virt-api; envtest points them at the local server.
func webhookConfiguration() *admissionv1.ValidatingWebhookConfiguration {
	webhook := func(name, path, resource string, operations ...admissionv1.OperationType) admissionv1.ValidatingWebhook {
		return admissionv1.ValidatingWebhook{
			Name:                    name,
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             ptr.To(admissionv1.SideEffectClassNone),
			FailurePolicy:           ptr.To(admissionv1.Fail),
			ClientConfig: admissionv1.WebhookClientConfig{
				Service: &admissionv1.ServiceReference{Namespace: kubeVirtNamespace, Name: "virt-api", Path: ptr.To(path)},
			},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: operations,
				Rule: admissionv1.Rule{
					APIGroups:   []string{"kubevirt.io"},
					APIVersions: []string{"v1"},
					Resources:   []string{resource},
				},
			}},
		}
	}
	return &admissionv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: "virt-api-validator"},
		Webhooks: []admissionv1.ValidatingWebhook{
			webhook(vmiWebhookName, vmiCreatePath, "virtualmachineinstances", admissionv1.Create),
			webhook(vmWebhookName, vmPath, "virtualmachines", admissionv1.Create, admissionv1.Update),
		},
	}
}

// The node directories the suite's KubeVirt CR allows overlay host paths
// under: golden images, and VMs' overlays.
var (
	backingPrefixes = []string{"/var/lib/images"}
	targetPrefixes  = []string{"/var/lib/overlays"}
)

// createKubeVirt creates the KubeVirt CR the webhook's cluster configuration
// follows, deployed, with the OverlayVolumes gate enabled and the host path
// prefixes allowed.
func createKubeVirt(server *apiserver.Server) {
	ctx := context.Background()
	core, err := kubernetes.NewForConfig(server.Config)
	Expect(err).ToNot(HaveOccurred())
	_, err = core.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeVirtNamespace}}, metav1.CreateOptions{})
	Expect(err).ToNot(HaveOccurred())

	kv := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "KubeVirt",
		"metadata":   map[string]any{"name": kubeVirtName, "namespace": kubeVirtNamespace},
		"spec": map[string]any{
			"configuration": map[string]any{
				"developerConfiguration": map[string]any{"featureGates": []any{overlayGate}},
				"overlayVolumes": map[string]any{
					"backingHostPathPrefixes": anySlice(backingPrefixes),
					"targetHostPathPrefixes":  anySlice(targetPrefixes),
				},
			},
		},
	}}
	kubeVirts := client.Resource(kubeVirtResource).Namespace(kubeVirtNamespace)
	created, err := kubeVirts.Create(ctx, kv, metav1.CreateOptions{})
	Expect(err).ToNot(HaveOccurred())
	// virt-api's cluster configuration only follows a KubeVirt CR that
	// virt-operator has given a phase.
	Expect(unstructured.SetNestedField(created.Object, "Deployed", "status", "phase")).To(Succeed())
	_, err = kubeVirts.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	Expect(err).ToNot(HaveOccurred())
}

// setFeatureGates replaces the feature gates of the KubeVirt CR.
func setFeatureGates(gates ...string) {
	setKubeVirtList(gates, "developerConfiguration", "featureGates")
}

// setHostPathPrefixes replaces the prefixes the KubeVirt CR allows overlay
// host paths under, backings' and targets'.
func setHostPathPrefixes(backing, target []string) {
	setKubeVirtList(backing, "overlayVolumes", "backingHostPathPrefixes")
	setKubeVirtList(target, "overlayVolumes", "targetHostPathPrefixes")
}

func setKubeVirtList(values []string, configPath ...string) {
	ctx := context.Background()
	kubeVirts := client.Resource(kubeVirtResource).Namespace(kubeVirtNamespace)
	kv, err := kubeVirts.Get(ctx, kubeVirtName, metav1.GetOptions{})
	Expect(err).ToNot(HaveOccurred())
	path := append([]string{"spec", "configuration"}, configPath...)
	Expect(unstructured.SetNestedSlice(kv.Object, anySlice(values), path...)).To(Succeed())
	_, err = kubeVirts.Update(ctx, kv, metav1.UpdateOptions{})
	Expect(err).ToNot(HaveOccurred())
}

func anySlice(values []string) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = v
	}
	return out
}

func describe(obj *unstructured.Unstructured) string {
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return fmt.Sprintf("%v", obj.Object)
	}
	return string(data)
}
