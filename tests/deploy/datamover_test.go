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
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

const (
	veleroNamespace = "velero"
	vmNamespace     = "vms"
	controllerUser  = "system:serviceaccount:kubevirt-datamover:datamover-controller"
)

var _ = Describe("deploy/datamover", Ordered, func() {
	var (
		ctx = context.Background()
		c   client.Client
	)

	BeforeAll(func() {
		scheme, err := datamover.NewScheme()
		Expect(err).ToNot(HaveOccurred())
		c, err = client.New(apiConfig, client.Options{Scheme: scheme})
		Expect(err).ToNot(HaveOccurred())
		for _, ns := range []string{veleroNamespace, vmNamespace} {
			err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		framework.ApplyServerSide(ctx, c, framework.Render("datamover"))
	})

	It("runs the controller from its image as its account, serving Velero's namespace", func() {
		d := &appsv1.Deployment{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "kubevirt-datamover", Name: "datamover-controller"}, d)).To(Succeed())
		pod := d.Spec.Template.Spec
		Expect(pod.ServiceAccountName).To(Equal("datamover-controller"))
		Expect(pod.Containers).To(HaveLen(1))
		Expect(pod.Containers[0].Image).To(Equal("registry.example.com/kubevirt-qcow2/datamover-controller:dev"))
		Expect(pod.Containers[0].Args).To(ContainElements("-namespace=velero", "-image=registry.example.com/kubevirt-qcow2/datamover:dev"))
		Expect(*d.Spec.Replicas).To(BeEquivalentTo(1))
		Expect(d.Spec.Strategy.Type).To(Equal(appsv1.RecreateDeploymentStrategyType))
	})

	It("serves the controller's metrics through a Service, on the port the controller binds", func() {
		d := &appsv1.Deployment{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "kubevirt-datamover", Name: "datamover-controller"}, d)).To(Succeed())
		svc := &corev1.Service{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "kubevirt-datamover", Name: "datamover-controller-metrics"}, svc)).To(Succeed())
		Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels))).To(BeTrue(),
			"the Service selects the controller's pods")
		Expect(svc.Spec.Ports).To(HaveLen(1))
		port := svc.Spec.Ports[0]
		Expect(port.Name).To(Equal("metrics"))
		Expect(port.TargetPort.StrVal).To(Equal("metrics"))
		ctr := d.Spec.Template.Spec.Containers[0]
		var containerPort int32
		for _, p := range ctr.Ports {
			if p.Name == "metrics" {
				containerPort = p.ContainerPort
			}
		}
		Expect(containerPort).NotTo(BeZero(), "the container names its metrics port")
		Expect(ctr.Args).To(ContainElement(fmt.Sprintf("-metrics-bind-address=:%d", containerPort)))
	})

	It("gives the controller a web identity token where OADP's STS profiles read it, through its component", func() {
		overlay := GinkgoT().TempDir()
		// kustomize takes bases and components by relative paths only.
		deploy, err := filepath.Rel(overlay, filepath.Join(testenv.RepoRoot(), "deploy", "datamover"))
		Expect(err).ToNot(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(fmt.Sprintf(
			"resources: [%s]\ncomponents: [%s]\n", deploy, filepath.Join(deploy, "web-identity"))), 0o644)).To(Succeed())
		var pod corev1.PodSpec
		for _, o := range framework.Render(overlay) {
			if o.GetKind() == "Deployment" {
				d := &appsv1.Deployment{}
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, d)).To(Succeed())
				pod = d.Spec.Template.Spec
			}
		}
		Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "web-identity-token", VolumeSource: corev1.VolumeSource{
			Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptr.To[int32](0o400), Sources: []corev1.VolumeProjection{{
				ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: datamover.DefaultWebIdentityAudience,
					ExpirationSeconds: ptr.To[int64](3600), Path: "token"}}}}}}))
		Expect(pod.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "web-identity-token",
			MountPath: "/var/run/secrets/openshift/serviceaccount", ReadOnly: true}))
		Expect(pod.Containers[0].Args).To(ContainElement("-namespace=velero"), "the base is kept")
	})

	// What pkg/datamover calls: cached reads list and watch, direct reads
	// get; writes as the reconcilers make them.
	DescribeTable("allows what the controller does",
		func(namespace, group, resource string, verbs ...string) {
			for _, verb := range verbs {
				Expect(framework.Allowed(ctx, c, controllerUser, namespace, group, resource, verb)).To(BeTrue(), "%s %s.%s in %q", verb, resource, group, namespace)
			}
		},
		Entry("watch and patch DataUploads", veleroNamespace, "velero.io", "datauploads", "get", "list", "watch", "patch"),
		Entry("watch and patch DataDownloads", veleroNamespace, "velero.io", "datadownloads", "get", "list", "watch", "patch"),
		Entry("watch locations", veleroNamespace, "velero.io", "backupstoragelocations", "get", "list", "watch"),
		Entry("read the locations' credentials", veleroNamespace, "", "secrets", "get"),
		Entry("record events on the requests", veleroNamespace, "", "events", "create", "patch"),
		Entry("watch, create and delete the pods in Velero's namespace", veleroNamespace, "", "pods", "get", "list", "watch", "create", "delete"),
		Entry("create and delete the pods' claims in Velero's namespace", veleroNamespace, "", "persistentvolumeclaims", "get", "create", "delete"),
		Entry("create and delete the backup's claim in the VM's namespace, bind a restored volume to the user's",
			vmNamespace, "", "persistentvolumeclaims", "get", "create", "delete", "patch"),
		Entry("move volumes between claims", "", "", "persistentvolumes", "get", "list", "patch"),
		Entry("read the VM, restart it once restored", vmNamespace, "kubevirt.io", "virtualmachines", "get", "patch"),
		Entry("see whether the VM still runs", vmNamespace, "kubevirt.io", "virtualmachineinstances", "get"),
		Entry("watch VirtualMachineInstances in every namespace", "", "kubevirt.io", "virtualmachineinstances", "list", "watch"),
		Entry("run VirtualMachineBackups", vmNamespace, "backup.kubevirt.io", "virtualmachinebackups", "get", "list", "watch", "create", "delete"),
		Entry("keep the trackers", vmNamespace, "backup.kubevirt.io", "virtualmachinebackuptrackers", "get", "create", "delete"),
		Entry("watch VirtualMachineBackups in every namespace", "", "backup.kubevirt.io", "virtualmachinebackups", "list", "watch"),
	)

	DescribeTable("allows nothing more",
		func(namespace, group, resource, verb string) {
			Expect(framework.Allowed(ctx, c, controllerUser, namespace, group, resource, verb)).To(BeFalse(), "%s %s.%s in %q", verb, resource, group, namespace)
		},
		Entry("read secrets outside Velero's namespace", vmNamespace, "", "secrets", "get"),
		Entry("write secrets in a VM's namespace (no credentials copy)", vmNamespace, "", "secrets", "create"),
		Entry("write secrets in Velero's namespace", veleroNamespace, "", "secrets", "create"),
		Entry("list secrets", veleroNamespace, "", "secrets", "list"),
		Entry("create pods in a VM's namespace", vmNamespace, "", "pods", "create"),
		Entry("watch pods in every namespace", "", "", "pods", "watch"),
		Entry("replace VMs", vmNamespace, "kubevirt.io", "virtualmachines", "update"),
		Entry("delete VMs", vmNamespace, "kubevirt.io", "virtualmachines", "delete"),
		Entry("delete volumes", "", "", "persistentvolumes", "delete"),
		Entry("delete DataUploads", veleroNamespace, "velero.io", "datauploads", "delete"),
		Entry("change locations", veleroNamespace, "velero.io", "backupstoragelocations", "patch"),
		Entry("touch DataUploads outside Velero's namespace", vmNamespace, "velero.io", "datauploads", "list"),
		Entry("take leases (no leader election)", veleroNamespace, "coordination.k8s.io", "leases", "create"),
	)

	It("lets the controller's manager fill its caches under this account", func() {
		// The controller as deployed: its account, its cache options, both
		// reconcilers registered on the manager.
		asController := rest.CopyConfig(apiConfig)
		asController.Impersonate = rest.ImpersonationConfig{UserName: controllerUser}
		scheme, err := datamover.NewScheme()
		Expect(err).ToNot(HaveOccurred())
		mgr, err := ctrl.NewManager(asController, ctrl.Options{
			Scheme:                 scheme,
			Cache:                  datamover.CacheOptions(veleroNamespace),
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
		})
		Expect(err).ToNot(HaveOccurred())
		mgrCtx, stop := context.WithCancel(ctx)
		Expect(datamover.Setup(mgrCtx, mgr, datamover.Config{Identity: "deploy-test", Image: "datamover:test",
			Command: "/usr/bin/datamover-upload", PollInterval: time.Second})).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mgrCtx) }()
		DeferCleanup(func() {
			stop()
			Eventually(done).WithTimeout(time.Minute).Should(Receive(Not(HaveOccurred())))
		})

		// Each cached read blocks until its informer has listed and is
		// watching: forbidden, it would time out.
		reads := []client.ObjectList{
			&velerov2.DataUploadList{}, &velerov2.DataDownloadList{}, &velerov1.BackupStorageLocationList{},
			&corev1.PodList{}, vmBackupList(),
		}
		for _, list := range reads {
			Eventually(func() error {
				readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				return mgr.GetCache().List(readCtx, list)
			}).WithTimeout(time.Minute).Should(Succeed(), "cached list of %T as the controller", list)
		}
		// The direct reads too; and a secret elsewhere stays out of reach.
		vm := &unstructured.Unstructured{}
		vm.SetAPIVersion("kubevirt.io/v1")
		vm.SetKind("VirtualMachine")
		err = mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "none"}, vm)
		Expect(err).To(MatchError(ContainSubstring("not found")))
		err = mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "none"}, &corev1.Secret{})
		Expect(err).To(MatchError(ContainSubstring("forbidden")))
	})
})

// The pods report progress on the requests in Velero's namespace, and do
// nothing else; beside OADP, all of it is in its namespace.
var _ = Describe("deploy/datamover's pods and its OADP overlay", Ordered, func() {
	const podUser = "system:serviceaccount:velero:datamover-pod"
	var (
		ctx = context.Background()
		c   client.Client
	)
	BeforeAll(func() {
		scheme, err := datamover.NewScheme()
		Expect(err).ToNot(HaveOccurred())
		c, err = client.New(apiConfig, client.Options{Scheme: scheme})
		Expect(err).ToNot(HaveOccurred())
		for _, ns := range []string{veleroNamespace, "openshift-adp"} {
			err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
		}
		framework.ApplyServerSide(ctx, c, framework.Render("datamover"))
	})

	It("gives the pods an account that patches the requests, so they report progress", func() {
		d := &appsv1.Deployment{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "kubevirt-datamover", Name: "datamover-controller"}, d)).To(Succeed())
		Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElement("-pod-service-account=datamover-pod"))
		Expect(c.Get(ctx, client.ObjectKey{Namespace: veleroNamespace, Name: "datamover-pod"}, &corev1.ServiceAccount{})).To(Succeed())
		for _, resource := range []string{"datauploads", "datadownloads"} {
			Expect(framework.Allowed(ctx, c, podUser, veleroNamespace, "velero.io", resource, "patch")).To(BeTrue(), resource)
			Expect(framework.Allowed(ctx, c, podUser, veleroNamespace, "velero.io", resource, "delete")).To(BeFalse(), resource)
		}
		for _, forbidden := range [][]string{{"", "secrets", "get"}, {"", "pods", "create"}, {"velero.io", "backupstoragelocations", "patch"}} {
			Expect(framework.Allowed(ctx, c, podUser, veleroNamespace, forbidden[0], forbidden[1], forbidden[2])).To(BeFalse(), "%v", forbidden)
		}
	})

	It("moves everything of Velero's namespace to openshift-adp beside OADP, and lets the pods run as 107 there", func() {
		objs := framework.Render("datamover-oadp")
		for _, o := range objs {
			Expect(o.GetNamespace()).ToNot(Equal(veleroNamespace), "%s %s", o.GetKind(), o.GetName())
		}
		framework.ApplyServerSide(ctx, c, objs)
		d := &appsv1.Deployment{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "kubevirt-datamover", Name: "datamover-controller"}, d)).To(Succeed())
		Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElements("-namespace=openshift-adp", "-pod-service-account=datamover-pod"))
		Expect(d.Spec.Template.Spec.SecurityContext.RunAsUser).To(BeNil(), "restricted-v2 assigns the controller's UID")
		for _, resource := range []string{"datauploads", "backupstoragelocations", "secrets", "pods"} {
			group := "velero.io"
			if resource == "secrets" || resource == "pods" {
				group = ""
			}
			Expect(framework.Allowed(ctx, c, controllerUser, "openshift-adp", group, resource, "get")).To(BeTrue(), resource)
		}
		const oadpPod = "system:serviceaccount:openshift-adp:datamover-pod"
		Expect(framework.Allowed(ctx, c, oadpPod, "openshift-adp", "velero.io", "datauploads", "patch")).To(BeTrue())
		Expect(framework.AllowedOn(ctx, c, oadpPod, authorizationv1.ResourceAttributes{Namespace: "openshift-adp",
			Group: "security.openshift.io", Resource: "securitycontextconstraints", Name: "nonroot-v2", Verb: "use"})).To(BeTrue())
		Expect(framework.AllowedOn(ctx, c, oadpPod, authorizationv1.ResourceAttributes{Namespace: "openshift-adp",
			Group: "security.openshift.io", Resource: "securitycontextconstraints", Name: "privileged", Verb: "use"})).To(BeFalse())
	})
})

func vmBackupList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion(kubevirtbackup.VMBackupGVK.GroupVersion().String())
	l.SetKind(kubevirtbackup.VMBackupGVK.Kind + "List")
	return l
}
