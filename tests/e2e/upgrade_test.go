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

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// The gates deploy/kubevirt sets, and one the cluster's administrator had
// set before.
var (
	qcow2Gates = []string{"OverlayVolumes", "HotplugVolumes", "HotplugContainerDisk", "ThinOverlayVolumes"}
	userGate   = "DownwardMetrics"
)

// The stock release's images, as `hack/kubevirt-images.sh stock` names them.
func stockImage(component string) string {
	return "quay.io/kubevirt/" + component + ":" + testenv.KubeVirtVersion()
}

// patchedImage is the name `make images` gave a patched component: the
// patched operator manifest's registry and tag.
func patchedImage(component string) string {
	manifest, err := os.ReadFile(filepath.Join(testenv.KubeVirtOut(), "manifests", "kubevirt-operator.yaml"))
	Expect(err).ToNot(HaveOccurred())
	m := operatorImage.FindSubmatch(manifest)
	Expect(m).ToNot(BeNil(), "no virt-operator image in the patched manifest")
	return strings.Replace(string(m[1]), "virt-operator", component, 1)
}

var imageValue = regexp.MustCompile(`(image|value): \S+/(virt-[a-z]+):\S+`)

// deployKubeVirt copies deploy/kubevirt into a directory of the spec and
// fills it in as docs/install.md tells an administrator to: the images
// where they were pushed, the cluster's own gates, if any, in both gate
// lists.
func deployKubeVirt(clusterGates ...string) string {
	dir := copyDeploy("kubevirt")
	edit := func(name string, change func(string) string) { editFile(filepath.Join(dir, name), change) }
	edit("virt-operator.yaml", func(s string) string {
		return imageValue.ReplaceAllStringFunc(s, func(v string) string {
			m := imageValue.FindStringSubmatch(v)
			return m[1] + ": " + patchedImage(m[2])
		})
	})
	if len(clusterGates) == 0 {
		return dir
	}
	edit("kubevirt.yaml", func(s string) string {
		return strings.Replace(s, "featureGates:\n", "featureGates:\n      - "+strings.Join(clusterGates, "\n      - ")+"\n", 1)
	})
	edit("rollback/release.yaml", func(s string) string {
		return strings.Replace(s, "featureGates: []", "featureGates: ["+strings.Join(clusterGates, ", ")+"]", 1)
	})
	return dir
}

// copyDeploy copies the kustomization deploy/<name> into a directory of
// the spec, for the spec to fill in.
func copyDeploy(name string) string {
	dir := filepath.Join(GinkgoT().TempDir(), name)
	Expect(os.CopyFS(dir, os.DirFS(filepath.Join(testenv.RepoRoot(), "deploy", name)))).To(Succeed())
	return dir
}

// editFile changes a file of such a copy, which must change.
func editFile(file string, change func(string) string) {
	data, err := os.ReadFile(file)
	Expect(err).ToNot(HaveOccurred())
	changed := change(string(data))
	Expect(changed).ToNot(Equal(string(data)), "nothing to fill in in %s", file)
	Expect(os.WriteFile(file, []byte(changed), 0o644)).To(Succeed())
}

// applyAsDocumented runs the kubectl command of docs/install.md's section
// that applies the kustomization dir names, on the spec's filled-in copy
// of it: the command as written, so the spec fails when the docs change.
func applyAsDocumented(ctx context.Context, section, dir, copied string) {
	words, err := testenv.DocCommand("docs/install.md", section, "-k "+dir)
	Expect(err).ToNot(HaveOccurred())
	Expect(words[0]).To(Equal("kubectl"))
	args := words[1:]
	Expect(args[len(args)-2:]).To(Equal([]string{"-k", dir}), "the command ends with the kustomization")
	args[len(args)-1] = copied
	out, err := kubectl(ctx, args...)
	Expect(err).ToNot(HaveOccurred())
	GinkgoWriter.Println(out)
}

// waitKubeVirtOn waits until virt-operator, then virt-api, virt-controller
// and virt-handler run the images image gives for them, rolled out, and
// KubeVirt is Available with the deployment that operator targets.
func waitKubeVirtOn(ctx context.Context, image func(string) string) {
	for _, w := range []struct{ kind, name string }{
		{"deployment", "virt-operator"}, {"deployment", "virt-api"}, {"deployment", "virt-controller"}, {"daemonset", "virt-handler"},
	} {
		Eventually(func() (string, error) {
			return kubectl(ctx, "-n", "kubevirt", "get", w.kind, w.name, "-o", "jsonpath={.spec.template.spec.containers[0].image}")
		}).WithContext(ctx).WithTimeout(10*time.Minute).WithPolling(5*time.Second).Should(Equal(image(w.name)), "%s/%s", w.kind, w.name)
		Expect(kubectl(ctx, "-n", "kubevirt", "rollout", "status", w.kind+"/"+w.name, "--timeout=10m")).Error().ToNot(HaveOccurred())
	}
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o",
			`jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.phase} {.status.targetDeploymentID} {.status.observedDeploymentID}`)
		g.Expect(err).ToNot(HaveOccurred())
		f := strings.Fields(out)
		g.Expect(f).To(HaveLen(4), "KubeVirt status: %s", out)
		g.Expect(f[:2]).To(Equal([]string{"True", "Deployed"}))
		g.Expect(f[3]).To(Equal(f[2]), "observed deployment")
	}).WithContext(ctx).WithTimeout(10 * time.Minute).WithPolling(5 * time.Second).Should(Succeed())
}

func kubevirtGates(ctx context.Context) []string {
	out, err := kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o",
		`jsonpath={.spec.configuration.developerConfiguration.featureGates[*]}`)
	Expect(err).ToNot(HaveOccurred())
	return strings.Fields(out)
}

// expectStillRunning checks that the VM runs in the same launcher pod,
// its domain running.
func expectStillRunning(ctx context.Context, vm, pod string) {
	Expect(launcherPod(ctx, vm)).To(Equal(pod), "the VM's pod was replaced")
	waitVMIReady(ctx, vm)
	Expect(virsh(ctx, vm, "domstate", namespace+"_"+vm)).To(Equal("running"))
}

// From stock KubeVirt to the patched one of the same release and back,
// each way as docs/install.md tells an administrator; the node starts fresh
// with the stock release (hack/cluster.sh kubevirt-stock).
var _ = Describe("upgrade from stock KubeVirt and rollback", Ordered, Label(upgradeLabel, linuxGuestLabel), func() {
	const (
		plain      = "stock-plain"
		persistent = "upgraded-persistent"
	)
	var deploy, plainPod, target, targetSHA, golden, goldenSHA string
	var plainFirst testenv.LinuxGuestStatus

	BeforeAll(func(ctx SpecContext) {
		// The administrator's own gate, set before anything of ours.
		Expect(kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "merge", "-p",
			`{"spec":{"configuration":{"developerConfiguration":{"featureGates":["`+userGate+`"]}}}}`)).Error().ToNot(HaveOccurred())
		golden = linuxGolden(ctx, "upgrade-golden")
		var err error
		goldenSHA, err = testenv.SHA256(golden)
		Expect(err).ToNot(HaveOccurred())
		deploy = deployKubeVirt(userGate)

		// A VM of the stock release, on a disk of its own.
		linuxDiskClaim(ctx, plain, 2*fileSize(golden))
		Expect(apply(ctx, linuxVMYAML(plain, "Always", "", "persistentVolumeClaim: {claimName: "+plain+"}"))).To(Succeed())
		waitVMIReady(ctx, plain)
		plainFirst = waitLinuxDone(ctx, plain)
		plainPod = launcherPod(ctx, plain)
	})

	It("switches to the patched KubeVirt while the stock VM runs on in its outdated pod", func(ctx SpecContext) {
		images := []string{}
		for _, c := range []string{"virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-launcher"} {
			images = append(images, filepath.Join(testenv.OutDir(), "images", c+".tar"))
		}
		// What `docker push` would be with a registry.
		Expect(run(ctx, clusterScript, append([]string{"import"}, images...)...)).To(Succeed())
		applyAsDocumented(ctx, "## Install", "deploy/kubevirt", deploy)
		waitKubeVirtOn(ctx, patchedImage)
		Expect(kubevirtGates(ctx)).To(ConsistOf(append(qcow2Gates, userGate)))

		expectStillRunning(ctx, plain, plainPod)
		Expect(kubectl(ctx, "-n", namespace, "get", "pod", plainPod, "-o", "jsonpath={.spec.containers[?(@.name==\"compute\")].image}")).
			To(Equal(stockImage("virt-launcher")))
		// virt-controller marks it, as after any KubeVirt update. Two of
		// its loops write what is checked: the VMI controller labels the
		// VMI, the workload updater counts the labelled VMIs into KubeVirt's
		// status later, on its own rate-limited queue; neither waits for
		// the other.
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "-n", namespace, "get", "vmi", plain, "-o", "jsonpath={.metadata.labels}")
			g.Expect(err).ToNot(HaveOccurred())
			var labels map[string]string
			g.Expect(json.Unmarshal([]byte(out), &labels)).To(Succeed())
			g.Expect(labels).To(HaveKey("kubevirt.io/outdatedLauncherImage"))
			g.Expect(kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o",
				"jsonpath={.status.outdatedVirtualMachineInstanceWorkloads}")).To(Equal("1"))
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(5 * time.Second).Should(Succeed())
	}, SpecTimeout(20*time.Minute))

	It("boots a new VM on a persistent overlay", func(ctx SpecContext) {
		target = filepath.Join(emptyFilesystemClaim(ctx, persistent+"-target", 2*fileSize(golden)), "disk.qcow2")
		vm := linuxVMYAML(persistent, "Always", "", `
overlay:
  backingPVC: {claimName: upgrade-golden}
  backingFormat: raw
  persistent: true
  targetPVC: {claimName: `+persistent+`-target}`)
		// virt-api reads the gates through an informer.
		Eventually(func() error { return apply(ctx, vm) }).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
		waitVMIReady(ctx, persistent)
		Expect(waitLinuxDone(ctx, persistent).Boot).To(Equal(1))
		Expect(launcherPod(ctx, persistent)).ToNot(BeEmpty())
		Expect(kubectl(ctx, "-n", namespace, "get", "pod", launcherPod(ctx, persistent), "-o", "jsonpath={.spec.containers[?(@.name==\"compute\")].image}")).
			To(Equal(patchedImage("virt-launcher")))
		Expect(virtctl(ctx, "-n", namespace, "stop", persistent)).Error().ToNot(HaveOccurred())
		waitVMIGone(ctx, persistent)
		Expect(checkImage(ctx, target).Clean()).To(BeTrue())
		var err error
		targetSHA, err = testenv.SHA256(target)
		Expect(err).ToNot(HaveOccurred())
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
	}, SpecTimeout(15*time.Minute))

	It("rolls back to the stock KubeVirt, keeping the cluster's gate and the running VM", func(ctx SpecContext) {
		applyAsDocumented(ctx, "## Roll back", "deploy/kubevirt/rollback", filepath.Join(deploy, "rollback"))
		waitKubeVirtOn(ctx, stockImage)
		Expect(kubevirtGates(ctx)).To(ConsistOf(userGate))
		expectStillRunning(ctx, plain, plainPod)

		// A VM without overlays starts again on the stock launcher.
		Expect(virtctl(ctx, "-n", namespace, "stop", plain)).Error().ToNot(HaveOccurred())
		waitVMIGone(ctx, plain)
		Expect(virtctl(ctx, "-n", namespace, "start", plain)).Error().ToNot(HaveOccurred())
		waitVMIReady(ctx, plain)
		// What the guest wrote under the stock release survived the
		// round trip.
		again := waitLinuxDone(ctx, plain)
		Expect(again.Boot).To(Equal(2))
		Expect(again.Listed).To(Equal(len(plainFirst.Published)))
		Expect(kubectl(ctx, "-n", namespace, "get", "pod", launcherPod(ctx, plain), "-o", "jsonpath={.spec.containers[?(@.name==\"compute\")].image}")).
			To(Equal(stockImage("virt-launcher")))
	}, SpecTimeout(20*time.Minute))

	// docs/install.md, "Roll back": the release's CRDs do not know
	// overlays; the API shows the volume without a source and refuses to
	// start the VM; the persistent overlay stays as it was.
	It("refuses to start a VM with an overlay after the rollback, its overlay untouched", func(ctx SpecContext) {
		volume, err := kubectl(ctx, "-n", namespace, "get", "vm", persistent, "-o", "jsonpath={.spec.template.spec.volumes[0]}")
		Expect(err).ToNot(HaveOccurred())
		Expect(volume).To(MatchJSON(`{"name": "rootdisk"}`))
		_, err = virtctl(ctx, "-n", namespace, "start", persistent)
		Expect(err).To(MatchError(ContainSubstring("spec.template.spec.volumes[0] must have exactly one source type set")))
		out, err := kubectl(ctx, "-n", namespace, "get", "vm", persistent, "-o", "jsonpath={.spec.runStrategy} {.status.printableStatus}")
		Expect(err).ToNot(HaveOccurred())
		Expect(out).To(Equal("Halted Stopped"))
		Expect(kubectl(ctx, "-n", namespace, "get", "vmi", persistent, "--ignore-not-found", "-o", "name")).To(BeEmpty())
		Expect(testenv.SHA256(target)).To(Equal(targetSHA), "the overlay was touched")
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
	}, SpecTimeout(5*time.Minute))
})
