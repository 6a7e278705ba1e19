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

package datamover_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	hcplugin "github.com/hashicorp/go-plugin"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt/process"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework/common"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/veleroplugin"
)

// pluginRegistry is the plugins one executable lists when asked as
// Velero's registry asks (its PluginLister over go-plugin). Velero's own
// registry also runs its own executable, here the suite, so it is not used.
type pluginRegistry struct {
	command string
	plugins []framework.PluginIdentifier
}

func discoverPlugins(command string) *pluginRegistry {
	c := hcplugin.NewClient(&hcplugin.ClientConfig{
		HandshakeConfig:  framework.Handshake(),
		AllowedProtocols: []hcplugin.Protocol{hcplugin.ProtocolGRPC},
		Plugins:          map[string]hcplugin.Plugin{string(common.PluginKindPluginLister): &framework.PluginListerPlugin{}},
		Cmd:              exec.Command(command),
		Stderr:           GinkgoWriter,
	})
	defer c.Kill()
	rpc, err := c.Client()
	Expect(err).NotTo(HaveOccurred(), "start the plugin")
	raw, err := rpc.Dispense(string(common.PluginKindPluginLister))
	Expect(err).NotTo(HaveOccurred())
	plugins, err := raw.(framework.PluginLister).ListPlugins()
	Expect(err).NotTo(HaveOccurred())
	return &pluginRegistry{command: command, plugins: plugins}
}

func (r *pluginRegistry) DiscoverPlugins() error { return nil }

func (r *pluginRegistry) List(kind common.PluginKind) []framework.PluginIdentifier {
	var out []framework.PluginIdentifier
	for _, p := range r.plugins {
		if p.Kind == kind {
			out = append(out, p)
		}
	}
	return out
}

func (r *pluginRegistry) Get(kind common.PluginKind, name string) (framework.PluginIdentifier, error) {
	for _, p := range r.List(kind) {
		if p.Name == name {
			return p, nil
		}
	}
	return framework.PluginIdentifier{}, &process.PluginNotFoundError{}
}

// vmItem is a VM as Velero reads it for a backup: unstructured, status
// included.
func vmItem(ctx context.Context, vm *testVM) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: vm.name}, u)).To(Succeed())
	return u
}

// asItem is obj as a backup's tarball holds it.
func asItem(obj runtime.Object) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{Object: m}
	gvks, _, err := scheme.ObjectKinds(obj)
	Expect(err).NotTo(HaveOccurred())
	u.SetGroupVersionKind(gvks[0])
	return u
}

// restoring is an item of a backup as Velero hands it to the restore item
// actions: its metadata down to name, namespace, labels and annotations,
// and no status (Velero's resetMetadataAndStatus).
func restoring(saved *unstructured.Unstructured) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(saved.GetAPIVersion())
	u.SetKind(saved.GetKind())
	u.SetName(saved.GetName())
	u.SetNamespace(saved.GetNamespace())
	u.SetLabels(saved.GetLabels())
	u.SetAnnotations(saved.GetAnnotations())
	for k, v := range saved.DeepCopy().Object {
		if k != "metadata" && k != "status" && k != "apiVersion" && k != "kind" {
			u.Object[k] = v
		}
	}
	return u
}

var _ = Describe("the Velero plugin", Ordered, func() {
	var plugins clientmgmt.Manager

	BeforeAll(func(ctx context.Context) {
		dir := GinkgoT().TempDir()
		command := filepath.Join(dir, "kubevirt-qcow2-velero-plugin")
		build := exec.CommandContext(ctx, "go", "build", "-o", command, "./cmd/velero-plugin")
		build.Dir = testenv.RepoRoot()
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "build the plugin: %s", out)

		// The plugin's process inherits the environment: it reaches the
		// suite's API server as Velero's pod reaches its own.
		config := filepath.Join(dir, "kubeconfig")
		Expect(os.WriteFile(config, kubeconfig, 0o600)).To(Succeed())
		old, had := os.LookupEnv("KUBECONFIG")
		Expect(os.Setenv("KUBECONFIG", config)).To(Succeed())
		DeferCleanup(func() {
			if had {
				_ = os.Setenv("KUBECONFIG", old)
			} else {
				_ = os.Unsetenv("KUBECONFIG")
			}
		})

		registry := discoverPlugins(command)
		Expect(registry.plugins).To(ConsistOf(
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindBackupItemActionV2, Name: veleroplugin.BackupActionName},
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindRestoreItemActionV2, Name: veleroplugin.RestoreActionName},
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindDeleteItemAction, Name: veleroplugin.DeleteActionName},
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindBackupItemActionV2, Name: veleroplugin.ClaimBackupActionName},
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindRestoreItemActionV2, Name: veleroplugin.ClaimRestoreActionName},
			framework.PluginIdentifier{Command: command, Kind: common.PluginKindRestoreItemActionV2, Name: veleroplugin.OwnedRestoreActionName},
		))
		logger := logrus.New()
		logger.SetOutput(GinkgoWriter)
		plugins = clientmgmt.NewManager(logger, logrus.InfoLevel, registry)
		DeferCleanup(plugins.CleanupClients)
	}, NodeTimeout(10*time.Minute))

	It("backs a VM up as Velero would, restores it renamed into another namespace and deletes the backup", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		atBackup := filepath.Join(GinkgoT().TempDir(), "at-backup.raw")
		Expect(vm.hv.Snapshot(ctx, atBackup)).To(Succeed())

		By("Velero's backup calling the backup item action on the VM, through the plugin framework")
		b := &velerov1.Backup{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("plugin-%d", specCounter.Add(1)), Namespace: veleroNamespace},
			Spec: velerov1.BackupSpec{
				IncludedNamespaces: []string{vm.namespace}, StorageLocation: loc.name, DataMover: datamover.DataMover,
				ItemOperationTimeout: metav1.Duration{Duration: 10 * time.Minute},
			},
			Status: velerov1.BackupStatus{Phase: velerov1.BackupPhaseInProgress},
		}
		Expect(k8s.Create(ctx, b)).To(Succeed())

		By("Velero's backup calling the claim backup action on the VM's claim and its volume first")
		claim := &corev1.PersistentVolumeClaim{}
		Eventually(func() (corev1.PersistentVolumeClaimPhase, error) {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: vm.namespace, Name: vm.claim}, claim)
			return claim.Status.Phase, err
		}).Should(Equal(corev1.ClaimBound))
		volume := &corev1.PersistentVolume{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: claim.Spec.VolumeName}, volume)).To(Succeed())
		cba, err := plugins.GetBackupItemActionV2(veleroplugin.ClaimBackupActionName)
		Expect(err).NotTo(HaveOccurred())
		var savedClaim, savedVolume *unstructured.Unstructured
		for _, it := range []struct {
			obj   runtime.Object
			saved **unstructured.Unstructured
		}{{claim, &savedClaim}, {volume, &savedVolume}} {
			out, _, _, _, err := cba.Execute(asItem(it.obj), b)
			Expect(err).NotTo(HaveOccurred())
			*it.saved = out.(*unstructured.Unstructured)
			Expect((*it.saved).GetAnnotations()).To(HaveKeyWithValue(veleroplugin.AnnotationDiskOf, vm.namespace+"/"+vm.name))
		}
		Expect(savedClaim.Object).To(HaveKeyWithValue("spec", HaveKeyWithValue("volumeName", volume.Name)), "saved bound")

		By("Velero's backup calling the backup item action on the VM")
		bia, err := plugins.GetBackupItemActionV2(veleroplugin.BackupActionName)
		Expect(err).NotTo(HaveOccurred())
		selector, err := bia.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(selector.IncludedResources).To(ConsistOf("virtualmachines.kubevirt.io"))
		updated, _, opID, post, err := bia.Execute(vmItem(ctx, vm), b)
		Expect(err).NotTo(HaveOccurred())
		Expect(opID).NotTo(BeEmpty())
		Expect(post).To(HaveLen(1))
		du := &velerov2.DataUpload{ObjectMeta: metav1.ObjectMeta{Namespace: post[0].Namespace, Name: post[0].Name}}
		Expect(updated.(*unstructured.Unstructured).GetAnnotations()).To(HaveKeyWithValue(velerov1.DataUploadNameAnnotation, du.Namespace+"/"+du.Name))

		By("the controller serving the DataUpload, and Velero polling the operation to its end")
		Eventually(func() velero.OperationProgress {
			p, err := bia.Progress(opID, b)
			Expect(err).NotTo(HaveOccurred())
			return p
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(And(
			HaveField("Completed", BeTrue()), HaveField("Err", BeEmpty()), HaveField("NCompleted", BeNumerically(">", 4<<20))))
		done := getDataUpload(ctx, du)
		Expect(done.Status.Phase).To(Equal(velerov2.DataUploadPhaseCompleted))
		Expect(done.Status.AcceptedByNode).To(Equal(identity))
		Expect(done.Status.SnapshotID).To(Equal(datamover.SnapshotID(b.Name, vm.namespace, vm.name)))
		Expect(*done.Status.DataMoverResult).To(HaveKeyWithValue(datamover.ResultType, string(catalog.Full)))
		expectTemporariesGone(ctx, done)
		repo := loc.repository()
		idx, err := repo.Index(ctx, vm.catalogVM())
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(1))
		Expect(idx.Checkpoints[0].ReferencedBy).To(ConsistOf(b.Name))

		By("Velero's restore into another namespace calling the restore item action on the saved VM")
		target := fmt.Sprintf("restored-%d", specCounter.Add(1))
		Expect(k8s.Create(ctx, restrictedNamespace(target))).To(Succeed())
		r := &velerov1.Restore{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("plugin-restore-%d", specCounter.Add(1)), Namespace: veleroNamespace},
			Spec: velerov1.RestoreSpec{BackupName: b.Name, NamespaceMapping: map[string]string{vm.namespace: target},
				ItemOperationTimeout: metav1.Duration{Duration: 10 * time.Minute}},
		}
		Expect(k8s.Create(ctx, r)).To(Succeed())

		// Velero restores volumes, then claims, then VMs.
		By("Velero's restore calling the claim restore action on the saved volume and claim")
		cra, err := plugins.GetRestoreItemActionV2(veleroplugin.ClaimRestoreActionName)
		Expect(err).NotTo(HaveOccurred())
		out, err := cra.Execute(&velero.RestoreItemActionExecuteInput{Item: restoring(savedVolume), ItemFromBackup: savedVolume, Restore: r})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeTrue(), "the volume is not restored")
		out, err = cra.Execute(&velero.RestoreItemActionExecuteInput{Item: restoring(savedClaim), ItemFromBackup: savedClaim, Restore: r})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeFalse())
		// Velero creates the claim the action returned, in the target
		// namespace.
		restoredClaim := out.UpdatedItem.(*unstructured.Unstructured)
		restoredClaim.SetNamespace(target)
		Expect(k8s.Create(ctx, restoredClaim)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(restoredClaim), claim)).To(Succeed())
		Expect(claim.Spec.VolumeName).To(BeEmpty())
		Expect(claim.Spec.Selector.MatchLabels).To(HaveKey(velerov1.DynamicPVRestoreLabel))
		Expect(claim.Annotations).NotTo(HaveKey(veleroplugin.AnnotationDiskOf))

		By("Velero's restore calling the owned-items action on a launcher pod the backup held")
		ora, err := plugins.GetRestoreItemActionV2(veleroplugin.OwnedRestoreActionName)
		Expect(err).NotTo(HaveOccurred())
		launcher := &unstructured.Unstructured{}
		launcher.SetAPIVersion("v1")
		launcher.SetKind("Pod")
		launcher.SetNamespace(vm.namespace)
		launcher.SetName("virt-launcher-" + vm.name + "-abcde")
		launcher.SetLabels(map[string]string{kubevirtv1.AppLabel: "virt-launcher"})
		out, err = ora.Execute(&velero.RestoreItemActionExecuteInput{Item: restoring(launcher), ItemFromBackup: launcher, Restore: r})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.SkipRestore).To(BeTrue(), "KubeVirt makes the launcher pod again")

		By("Velero's restore calling the restore item action on the saved VM")
		ria, err := plugins.GetRestoreItemActionV2(veleroplugin.RestoreActionName)
		Expect(err).NotTo(HaveOccurred())
		saved := updated.(*unstructured.Unstructured)
		renamed := saved.DeepCopy()
		renamed.SetNamespace(target)
		renamed.SetName(vm.name + "-copy")
		Expect(unstructured.SetNestedField(renamed.Object, string(kubevirtv1.RunStrategyAlways), "spec", "runStrategy")).To(Succeed())
		out, err = ria.Execute(&velero.RestoreItemActionExecuteInput{Item: renamed, ItemFromBackup: saved, Restore: r})
		Expect(err).NotTo(HaveOccurred())
		Expect(out.OperationID).NotTo(BeEmpty())
		restoredVM := out.UpdatedItem.(*unstructured.Unstructured)
		strategy, _, _ := unstructured.NestedString(restoredVM.Object, "spec", "runStrategy")
		Expect(strategy).To(Equal(string(kubevirtv1.RunStrategyHalted)), "restored stopped")
		Expect(restoredVM.GetAnnotations()).To(HaveKeyWithValue(datamover.AnnotationOriginalRunStrategy, "Always"))
		// Velero creates the item the action returned.
		restoredVM.SetResourceVersion("")
		restoredVM.SetUID("")
		Expect(k8s.Create(ctx, restoredVM)).To(Succeed())

		Eventually(func() velero.OperationProgress {
			p, err := ria.Progress(out.OperationID, r)
			Expect(err).NotTo(HaveOccurred())
			return p
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(And(HaveField("Completed", BeTrue()), HaveField("Err", BeEmpty())))
		dds := &velerov2.DataDownloadList{}
		Expect(k8s.List(ctx, dds, client.InNamespace(veleroNamespace), client.MatchingLabels{velerov1.AsyncOperationIDLabel: out.OperationID})).To(Succeed())
		Expect(dds.Items).To(HaveLen(1))
		expectRestoredInto(ctx, &dds.Items[0], target, vm.claim, must(testenv.SHA256(atBackup)))
		Eventually(func() (string, error) {
			u := restoredVM.DeepCopy()
			err := k8s.Get(ctx, client.ObjectKeyFromObject(u), u)
			s, _, _ := unstructured.NestedString(u.Object, "spec", "runStrategy")
			return s, err
		}).Should(Equal(string(kubevirtv1.RunStrategyAlways)), "started again once its disk is restored")

		By("Velero's deletion of the backup calling the delete item action on the DataUpload of its tarball")
		dia, err := plugins.GetDeleteItemAction(veleroplugin.DeleteActionName)
		Expect(err).NotTo(HaveOccurred())
		selector, err = dia.AppliesTo()
		Expect(err).NotTo(HaveOccurred())
		Expect(selector.IncludedResources).To(ConsistOf("datauploads.velero.io"))
		Expect(dia.Execute(&velero.DeleteItemActionExecuteInput{Item: asItem(getDataUpload(ctx, du)), Backup: b})).To(Succeed())
		backups, err := repo.Backups(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(backups).To(BeEmpty())
		idx, err = repo.Index(ctx, vm.catalogVM())
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(BeEmpty())
		objects, err := repo.Store.List(ctx, "")
		Expect(err).NotTo(HaveOccurred())
		var keys []string
		for _, o := range objects {
			keys = append(keys, o.Key)
		}
		Expect(keys).To(ConsistOf(catalog.VMIndexPath(vm.catalogVM())), "only the VM's empty index: %s", strings.Join(keys, ", "))
	}, NodeTimeout(10*time.Minute))
})
