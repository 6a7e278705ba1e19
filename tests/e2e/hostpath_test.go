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
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Host paths are the cluster administrator's decision: the KubeVirt CR
// lists where golden images are read and where overlays are kept, apart,
// with no HostDisk gate; a VM's target is its own directory, and
// virt-handler resolves every path on the node, where a link can lead
// anywhere.
var _ = Describe("overlay host paths on the node", Ordered, Label(bootSectorGuestLabel), func() {
	const (
		images   = "/var/lib/e2e-images"
		overlays = "/var/lib/e2e-overlays"
		outside  = "/var/lib/e2e-elsewhere"
	)
	// targetOf is the directory of volume rootdisk of the VM vm.
	targetOf := func(vm string) string { return filepath.Join(overlays, namespace, vm, "rootdisk") }

	BeforeAll(func(ctx SpecContext) {
		image := filepath.Join(volumesDir, "hostpath-golden.img")
		Expect(os.RemoveAll(image)).To(Succeed())
		Expect(os.MkdirAll(volumesDir, 0o755)).To(Succeed())
		Expect(testenv.CreateBootDisk(ctx, image, goldenSize, guestParams)).To(Succeed())
		// Only the node's mount namespace has these directories.
		Expect(inNode(ctx, "sh", "-c", "rm -rf "+overlays+" && mkdir -p "+images+" "+outside+
			" && cp "+image+" "+images+"/golden.raw && cp "+image+" "+outside+"/golden.raw"+
			" && chmod 0644 "+images+"/golden.raw "+outside+"/golden.raw"+
			" && ln -sfn "+outside+"/golden.raw "+images+"/link.raw")).Error().ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			_, err := inNode(ctx, "rm", "-rf", images, overlays, outside)
			Expect(err).ToNot(HaveOccurred())
		})

		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/overlayVolumes","value":`+
			`{"backingHostPathPrefixes":["`+images+`"],"targetHostPathPrefixes":["`+overlays+`"]}}]`)
		// virt-api, virt-controller and virt-handler read the CR through
		// informers: wait until admission takes the path.
		Eventually(func() error {
			_, err := kubectlIn(ctx, vmYAML("probe", "Halted", backingHostPath(images+"/golden.raw")), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())

		createTenant(ctx)
	})

	It("boots a VM from a persistent overlay in its own directory over an allowed host path", func(ctx SpecContext) {
		vm := "hostpath-golden"
		Expect(apply(ctx, vmYAML(vm, "Always", backingHostPath(images+"/golden.raw")+"\n"+
			"  persistent: true\n  targetHostPath: {path: "+targetOf(vm)+"}"))).To(Succeed())
		waitVMIReady(ctx, vm)
		waitGuestDone(ctx, vm)
		// The kubelet made the directories, root's; virt-handler gave the
		// VM's own, and only it, to the qemu user.
		out, err := inNode(ctx, "stat", "-c", "%n %u %a",
			filepath.Join(overlays, namespace), filepath.Join(overlays, namespace, vm), targetOf(vm))
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(out)).To(Equal([]string{
			filepath.Join(overlays, namespace), "0", "755",
			filepath.Join(overlays, namespace, vm), "0", "755",
			targetOf(vm), "107", "755",
		}))
		Expect(inNode(ctx, "stat", "-c", "%u", filepath.Join(targetOf(vm), "disk.qcow2"))).To(Equal("107"))
		deleteVM(ctx, vm)
	}, SpecTimeout(10*time.Minute))

	It("fails the VMI, ending its pod, for a host path that a link on the node leads out of the allowed prefixes", func(ctx SpecContext) {
		vm := "hostpath-link"
		// Admission reads the text, which lies under the prefix; the
		// kubelet mounts what the link leads to.
		Expect(apply(ctx, vmYAML(vm, "Always", backingHostPath(images+"/link.raw")))).To(Succeed())
		waitRefusedOnNode(ctx, vm, "resolves on the node to "+outside+"/golden.raw, which is not below a directory the cluster allows for golden images")
		deleteVM(ctx, vm)
	}, SpecTimeout(10*time.Minute))

	It("never hands a VM a target directory that holds someone else's files", func(ctx SpecContext) {
		vm := "hostpath-taken"
		planted := filepath.Join(targetOf(vm), "disk.qcow2")
		_, err := inNode(ctx, "sh", "-c", "mkdir -p "+targetOf(vm)+" && echo planted > "+planted)
		Expect(err).ToNot(HaveOccurred())
		Expect(apply(ctx, vmYAML(vm, "Always", backingHostPath(images+"/golden.raw")+"\n"+
			"  persistent: true\n  targetHostPath: {path: "+targetOf(vm)+"}"))).To(Succeed())
		waitRefusedOnNode(ctx, vm, "the directory holds files and is not the virt-launcher's user's")
		deleteVM(ctx, vm)
		out, err := inNode(ctx, "sh", "-c", "stat -c %u "+targetOf(vm)+" && cat "+planted)
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(out)).To(Equal([]string{"0", "planted"}), "the directory is still root's, the file untouched")
	}, SpecTimeout(10*time.Minute))

	DescribeTable("refuses a namespace's VM author what would reach the node or another tenant",
		func(ctx SpecContext, volume, field, message string) {
			out, err := kubectlIn(ctx, vmYAML("hostile", "Halted", volume), asTenant, "create", "--dry-run=server", "-f", "-")
			Expect(err).To(HaveOccurred(), out)
			Expect(err.Error()).To(And(ContainSubstring(field), ContainSubstring(message)))
		},
		Entry("another tenant's overlay as target",
			"overlay:\n  backingHostPath: {path: "+images+"/golden.raw}\n  persistent: true\n  targetHostPath: {path: "+overlays+"/other-tenant/hostile/rootdisk}",
			"spec.template.spec.volumes[0].overlay.targetHostPath.path", "the directory of this VM's volume: a target directory belongs to one VM"),
		Entry("the shared target prefix itself",
			"overlay:\n  backingHostPath: {path: "+images+"/golden.raw}\n  persistent: true\n  targetHostPath: {path: "+overlays+"}",
			"spec.template.spec.volumes[0].overlay.targetHostPath.path", "must be <prefix>/<namespace>/<VM name>/<volume name>"),
		Entry("the golden images' directory as target",
			"overlay:\n  backingHostPath: {path: "+images+"/golden.raw}\n  persistent: true\n  targetHostPath: {path: "+images+"}",
			"spec.template.spec.volumes[0].overlay.targetHostPath.path", "must be <prefix>/<namespace>/<VM name>/<volume name>"),
		Entry("another VM's overlay as backing",
			"overlay:\n  backingHostPath: {path: "+overlays+"/other-tenant/vm1/rootdisk/disk.qcow2}\n  backingFormat: qcow2",
			"spec.template.spec.volumes[0].overlay.backingHostPath.path", "must not overlap the directory for overlays"),
		Entry("a node file outside the golden images",
			"overlay:\n  backingHostPath: {path: /etc/shadow}",
			"spec.template.spec.volumes[0].overlay.backingHostPath.path", "is not below a directory the cluster allows for golden images"),
		Entry("KubeVirt's own hostDisk, whose gate stays off",
			"hostDisk: {path: /etc/shadow, type: Disk}",
			"spec.template.spec.volumes[0]", "HostDisk feature gate is not enabled"),
	)

	It("leaves the host path prefixes to the cluster's administrators", func(ctx SpecContext) {
		_, err := kubectl(ctx, "-n", "kubevirt", asTenant, "patch", "kubevirt", "kubevirt", "--type", "json", "-p",
			`[{"op":"replace","path":"/spec/configuration/overlayVolumes/targetHostPathPrefixes","value":["/"]}]`)
		Expect(err).To(MatchError(ContainSubstring("forbidden")))
	})

	It("refuses host paths again once the prefixes are gone from the KubeVirt CR", func(ctx SpecContext) {
		_, err := kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "json", "-p",
			`[{"op":"remove","path":"/spec/configuration/overlayVolumes"}]`)
		Expect(err).ToNot(HaveOccurred())
		Eventually(func() error {
			_, err := kubectlIn(ctx, vmYAML("probe", "Halted", backingHostPath(images+"/golden.raw")), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(MatchError(ContainSubstring("spec.template.spec.volumes[0].overlay.backingHostPath")))
	})
})

// waitRefusedOnNode waits until virt-handler refuses a VMI of the VM with
// message (a SyncFailed event), and until that VMI's virt-launcher pod, which
// the kubelet gave what the path led to, is gone: the refusal fails the
// VMI, which never ran, and the VM's run strategy deletes it with its pod.
func waitRefusedOnNode(ctx context.Context, vm, message string) {
	var uid string
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "get", "events", "--field-selector", "involvedObject.kind=VirtualMachineInstance,involvedObject.name="+vm+",reason=SyncFailed",
			"-o", `jsonpath={range .items[*]}{.involvedObject.uid} {.message}{"\n"}{end}`)
		g.Expect(err).ToNot(HaveOccurred())
		for _, line := range strings.Split(out, "\n") {
			if id, msg, ok := strings.Cut(line, " "); ok && strings.Contains(msg, message) {
				uid = id
			}
		}
		g.Expect(uid).ToNot(BeEmpty(), "SyncFailed events of %s: %s", vm, out)
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
	out, err := kubectl(ctx, "-n", namespace, "get", "events", "--field-selector", "involvedObject.uid="+uid+",reason=Started", "-o", "name")
	Expect(err).ToNot(HaveOccurred())
	Expect(out).To(BeEmpty(), "the refused VMI never ran")
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "get", "pods", "-l", "kubevirt.io/created-by="+uid,
			"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(out).ToNot(Or(ContainSubstring("=Running"), ContainSubstring("=Pending")), "virt-launcher pod of the refused VMI")
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

func backingHostPath(path string) string {
	return `
overlay:
  backingHostPath: {path: ` + path + `}
  backingFormat: raw`
}
