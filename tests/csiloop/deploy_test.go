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

package csiloop_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop/csilooptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The pod's account, which both sidecars run as.
const sidecarUser = "system:serviceaccount:csi-loop:csi-loop"

// deploy/csi-loop applied to a real kube-apiserver: the objects validate,
// the pod is wired as kubelet and the sidecars need, and the account may do
// what the sidecars do. Running it under kubelet is the one-node cluster's.
var _ = Describe("deploy/csi-loop", Ordered, func() {
	var (
		ctx    = context.Background()
		c      client.Client
		server *apiserver.Server
	)

	BeforeAll(func() {
		var err error
		server, err = apiserver.Start(ctx)
		framework.Require(err, "kube-apiserver and etcd")
		DeferCleanup(server.Stop)
		c, err = client.New(server.Config, client.Options{Scheme: scheme.Scheme})
		Expect(err).ToNot(HaveOccurred())
		framework.ApplyServerSide(ctx, c, framework.Render("csi-loop"))
	})

	It("registers the driver for Block volumes that grow, with nothing to attach", func() {
		driver := &storagev1.CSIDriver{}
		Expect(c.Get(ctx, client.ObjectKey{Name: csiloop.DefaultDriverName}, driver)).To(Succeed())
		Expect(*driver.Spec.AttachRequired).To(BeFalse())
		Expect(*driver.Spec.PodInfoOnMount).To(BeFalse())
		Expect(driver.Spec.VolumeLifecycleModes).To(ConsistOf(storagev1.VolumeLifecyclePersistent))

		class := &storagev1.StorageClass{}
		Expect(c.Get(ctx, client.ObjectKey{Name: "csi-loop"}, class)).To(Succeed())
		Expect(class.Provisioner).To(Equal(csiloop.DefaultDriverName))
		Expect(*class.AllowVolumeExpansion).To(BeTrue())
	})

	It("runs the driver and both sidecars from local images, on one socket kubelet knows", func() {
		ds := &appsv1.DaemonSet{}
		Expect(c.Get(ctx, client.ObjectKey{Namespace: "csi-loop", Name: "csi-loop"}, ds)).To(Succeed())
		pod := ds.Spec.Template.Spec
		Expect(pod.ServiceAccountName).To(Equal("csi-loop"))
		containers := map[string]corev1.Container{}
		for _, ctr := range pod.Containers {
			containers[ctr.Name] = ctr
			Expect(ctr.Image).To(Equal("kubevirt-qcow2/" + ctr.Name + ":dev"))
			Expect(ctr.ImagePullPolicy).To(Equal(corev1.PullNever))
		}
		Expect(containers).To(HaveLen(3))
		hostPaths := map[string]string{}
		for _, v := range pod.Volumes {
			hostPaths[v.Name] = v.HostPath.Path
		}

		driver := containers["csi-loop"]
		Expect(*driver.SecurityContext.Privileged).To(BeTrue())
		mounts := map[string]corev1.VolumeMount{}
		for _, m := range driver.VolumeMounts {
			mounts[m.MountPath] = m
			Expect(hostPaths[m.Name]).To(Equal(m.MountPath), "the driver sees node paths where the node has them")
		}
		Expect(mounts).To(HaveKey("/dev"))
		Expect(*mounts["/var/lib/kubelet"].MountPropagation).To(Equal(corev1.MountPropagationBidirectional))
		args := flags(driver.Args)
		Expect(args["-registration-socket"]).To(Equal("/var/lib/kubelet/plugins_registry/" + csiloop.DefaultDriverName + "-reg.sock"))
		Expect(mounts).To(HaveKey(args["-state-dir"]))
		endpoint := args["-endpoint"]
		Expect(endpoint).To(HavePrefix("/var/lib/kubelet/plugins/"))

		for _, name := range []string{"csi-provisioner", "csi-resizer"} {
			sidecar := containers[name]
			Expect(flags(sidecar.Args)).To(HaveKeyWithValue("--csi-address", "/csi/csi.sock"), name)
			Expect(sidecar.Args).To(ContainElement("--leader-election"), "%s: one node's act for all", name)
			Expect(sidecar.VolumeMounts).To(ConsistOf(HaveField("MountPath", "/csi")), name)
			Expect(hostPaths[sidecar.VolumeMounts[0].Name]).To(Equal(filepath.Dir(endpoint)), "%s reaches the driver's socket", name)
		}
	})

	DescribeTable("lets the sidecars do their work",
		func(group, resource string, verbs ...string) {
			for _, verb := range verbs {
				Expect(framework.Allowed(ctx, c, sidecarUser, "", group, resource, verb)).To(BeTrue(), "%s %s.%s", verb, resource, group)
			}
		},
		Entry("provision and delete volumes", "", "persistentvolumes", "get", "list", "watch", "create", "delete", "patch"),
		Entry("watch and update claims", "", "persistentvolumeclaims", "get", "list", "watch", "update"),
		Entry("read StorageClasses", "storage.k8s.io", "storageclasses", "get", "list", "watch"),
		Entry("read nodes and CSINodes", "storage.k8s.io", "csinodes", "get", "list", "watch"),
		Entry("read VolumeAttachments", "storage.k8s.io", "volumeattachments", "get", "list", "watch"),
		Entry("record events", "", "events", "create", "patch"),
		Entry("report a claim's new size", "", "persistentvolumeclaims/status", "patch"),
		Entry("see which pods use a claim", "", "pods", "get", "list", "watch"),
		Entry("read VolumeAttributesClasses", "storage.k8s.io", "volumeattributesclasses", "get", "list", "watch"),
	)

	It("lets the sidecars elect a leader in the driver's namespace only", func() {
		for _, verb := range []string{"get", "watch", "list", "delete", "update", "create"} {
			Expect(framework.Allowed(ctx, c, sidecarUser, "csi-loop", "coordination.k8s.io", "leases", verb)).To(BeTrue(), verb)
		}
		Expect(framework.Allowed(ctx, c, sidecarUser, "kube-system", "coordination.k8s.io", "leases", "create")).To(BeFalse())
	})

	DescribeTable("allows nothing more",
		func(group, resource, verb string) {
			Expect(framework.Allowed(ctx, c, sidecarUser, "", group, resource, verb)).To(BeFalse(), "%s %s.%s", verb, resource, group)
		},
		Entry("read secrets", "", "secrets", "get"),
		Entry("delete claims", "", "persistentvolumeclaims", "delete"),
		Entry("change StorageClasses", "storage.k8s.io", "storageclasses", "update"),
		Entry("change pods", "", "pods", "delete"),
	)

	// Without kubelet (the cluster's part) and without kube-controller-
	// manager: the test does what its PV controller would, annotating,
	// binding and releasing; the sidecars do the rest.
	It("provisions, grows and deletes volumes through the real external-provisioner and external-resizer, as the account", func(ctx SpecContext) {
		sidecars, err := sidecarBinaries()
		framework.Require(err, "the CSI sidecars (hack/csi-sidecars.sh)")
		dir := GinkgoT().TempDir()
		d, err := csilooptest.Start(csiloop.Config{
			NodeID: "node-a", StateDir: filepath.Join(dir, "state"), Logger: GinkgoLogr,
		}, filepath.Join(dir, "csi.sock"))
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(d.Stop)
		user, err := server.Env.AddUser(envtest.User{Name: sidecarUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:csi-loop"}}, nil)
		Expect(err).ToNot(HaveOccurred())
		kubeconfig, err := user.KubeConfig()
		Expect(err).ToNot(HaveOccurred())
		kubeconfigPath := filepath.Join(dir, "kubeconfig")
		Expect(os.WriteFile(kubeconfigPath, kubeconfig, 0o600)).To(Succeed())
		for _, name := range []string{"csi-provisioner", "csi-resizer"} {
			startSidecar(filepath.Join(sidecars, name), "--csi-address="+d.Socket, "--kubeconfig="+kubeconfigPath,
				"--leader-election", "--leader-election-namespace=csi-loop", "--v=2")
		}

		Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vms"}})).To(Succeed())
		block := corev1.PersistentVolumeBlock
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: "thin", Annotations: map[string]string{
				"volume.kubernetes.io/storage-provisioner": csiloop.DefaultDriverName, // the PV controller's
			}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode:       &block,
				StorageClassName: ptr.To("csi-loop"),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}},
			},
		}
		Expect(c.Create(ctx, pvc)).To(Succeed())

		By("provisioning: CreateVolume, and a PV of the claim")
		pv := &corev1.PersistentVolume{}
		Eventually(func() error {
			return c.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, pv)
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
		Expect(pv.Spec.CSI.Driver).To(Equal(csiloop.DefaultDriverName))
		Expect(pv.Spec.CSI.VolumeHandle).To(Equal(pv.Name))
		Expect(*pv.Spec.VolumeMode).To(Equal(block))
		Expect(pv.Spec.ClaimRef.UID).To(Equal(pvc.UID))
		Expect(pv.Spec.Capacity.Storage().Value()).To(Equal(16 * mib))
		file := filepath.Join(dir, "state", "volumes", pv.Name+".img")
		Expect(sizeOf(file)).To(Equal(16 * mib))

		By("binding the claim, as the PV controller would")
		pvc.Spec.VolumeName = pv.Name
		Expect(c.Update(ctx, pvc)).To(Succeed())
		pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: pvc.Spec.AccessModes,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}
		Expect(c.Status().Update(ctx, pvc)).To(Succeed())

		By("growing the claim: ControllerExpandVolume, the PV's new size, node expansion pending")
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("48Mi")
		Expect(c.Update(ctx, pvc)).To(Succeed())
		Eventually(func() int64 {
			Expect(c.Get(ctx, client.ObjectKeyFromObject(pv), pv)).To(Succeed())
			return pv.Spec.Capacity.Storage().Value()
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(48 * mib))
		Expect(sizeOf(file)).To(Equal(48 * mib))
		Eventually(func() []corev1.PersistentVolumeClaimConditionType {
			Expect(c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
			var types []corev1.PersistentVolumeClaimConditionType
			for _, cond := range pvc.Status.Conditions {
				types = append(types, cond.Type)
			}
			return types
		}).WithContext(ctx).WithTimeout(time.Minute).Should(ContainElement(corev1.PersistentVolumeClaimFileSystemResizePending),
			"kubelet's NodeExpandVolume is next")

		By("deleting: DeleteVolume once the claim is gone and the PV released")
		pvc.Finalizers = nil // kube-controller-manager's pvc-protection
		Expect(c.Update(ctx, pvc)).To(Succeed())
		Expect(c.Delete(ctx, pvc)).To(Succeed())
		pv.Status.Phase = corev1.VolumeReleased
		Expect(c.Status().Update(ctx, pv)).To(Succeed())
		Eventually(func() error {
			_, err := os.Stat(file)
			return err
		}).WithContext(ctx).WithTimeout(time.Minute).Should(MatchError(os.ErrNotExist))
		Eventually(func() *metav1.Time {
			Expect(c.Get(ctx, client.ObjectKeyFromObject(pv), pv)).To(Succeed())
			return pv.DeletionTimestamp
		}).WithContext(ctx).WithTimeout(time.Minute).ShouldNot(BeNil(), "the provisioner deletes the PV")
	}, NodeTimeout(5*time.Minute))
})

// sidecarBinaries is the directory of csi-provisioner and csi-resizer,
// built once into the cache by hack/csi-sidecars.sh.
func sidecarBinaries() (string, error) {
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "csi-sidecars.sh"))
	cmd.Stderr = GinkgoWriter
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/csi-sidecars.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// startSidecar runs a sidecar, logging to the spec's output, until the
// spec ends.
func startSidecar(bin string, args ...string) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

// flags maps "-name=value" arguments by name.
func flags(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		name, value, _ := strings.Cut(a, "=")
		m[name] = value
	}
	return m
}
