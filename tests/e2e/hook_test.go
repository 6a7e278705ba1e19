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
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

// The hook image as `make images` leaves it, imported under this name.
const hookImage = "kubevirt-qcow2/overlay-hook:e2e"

// importHookImage imports the hook's image layout into the node.
func importHookImage(ctx context.Context) {
	img, err := ociimage.Load(ctx, ociimage.SourceLayout+filepath.Join(testenv.OutDir(), "images", "overlay-hook"), ociimage.DefaultPlatform)
	Expect(err).ToNot(HaveOccurred(), "the hook's image (make images builds it)")
	archive := filepath.Join(GinkgoT().TempDir(), "overlay-hook.tar")
	Expect(ociimage.WriteArchive(ctx, archive, hookImage, img)).To(Succeed())
	Expect(run(ctx, clusterScript, "import", archive)).To(Succeed())
}

// hookVMYAML is linuxVMYAML with the hook sidecar on the VM's template, as
// docs/hooks.md lays it out: its claim, store, holds the golden image and
// the persistent overlays; the disk's own volume is an emptyDisk that only
// holds the place (Kubernetes mounts a claim once per pod).
func hookVMYAML(name, store, disks string) string {
	return strings.Replace(linuxVMYAML(name, "Always", "", "emptyDisk: {capacity: 1Mi}"),
		"\n  template:\n", fmt.Sprintf(`
  template:
    metadata:
      annotations:
        hooks.kubevirt.io/hookSidecars: '[{"image": "%s", "imagePullPolicy": "IfNotPresent",
          "pvc": {"name": "%s", "volumePath": "/store", "sharedComputePath": "/var/run/kubevirt-qcow2/store"}}]'
        overlay.kubevirt-qcow2.io/disks: '{"disks": [%s]}'
`, hookImage, store, disks), 1)
}

// rootdiskSource is the file QEMU opens for the VM's root disk.
func rootdiskSource(ctx context.Context, vm string) string {
	for _, line := range strings.Split(domainDisks(ctx, vm), "\n") {
		if fields := strings.Fields(line); len(fields) == 2 && fields[0] == "vda" {
			return fields[1]
		}
	}
	Fail("the domain has no vda:\n" + domainDisks(ctx, vm))
	return ""
}

// With the Sidecar gate (deploy/kubevirt-hook adds it), an unpatched
// KubeVirt's hook API makes the overlays: the hook image from `make images`
// on the node.
var _ = Describe("the overlay hook sidecar", Ordered, Label(linuxGuestLabel), func() {
	const store = "hook-store"
	var golden, goldenSHA string

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"Sidecar"}]`)
		// virt-api reads the gates through an informer.
		Eventually(func() error {
			_, err := kubectlIn(ctx, hookVMYAML("probe", store, `{"name": "rootdisk", "backing": "disk.img"}`), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
		importHookImage(ctx)
		// The sidecar runs as the launcher's user and makes the persistent
		// overlays beside the golden image.
		golden = linuxDiskClaim(ctx, store, 512<<20)
		var err error
		goldenSHA, err = testenv.SHA256(golden)
		Expect(err).ToNot(HaveOccurred())
	})

	It("boots the disk on an ephemeral overlay in the pod, the golden image unchanged", func(ctx SpecContext) {
		const vm = "hook-ephemeral"
		overlay := "/var/run/kubevirt-hooks/hook-sidecar-0/overlays/rootdisk.qcow2"
		Expect(apply(ctx, hookVMYAML(vm, store, `{"name": "rootdisk", "backing": "disk.img"}`))).To(Succeed())
		waitVMIReady(ctx, vm)
		status := waitLinuxDone(ctx, vm)
		Expect(status.Boot).To(Equal(1))

		Expect(rootdiskSource(ctx, vm)).To(Equal(overlay))
		xml, err := virsh(ctx, vm, "dumpxml", namespace+"_"+vm)
		Expect(err).ToNot(HaveOccurred())
		Expect(xml).To(ContainSubstring("<source file='/var/run/kubevirt-qcow2/store/disk.img'"))
		// What the guest wrote is in the overlay.
		pod := launcherPod(ctx, vm)
		Expect(allocatedInTop(ctx, pod, overlay)).To(BeNumerically(">=", publishedBytes(status)))
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image changed")

		deleteVM(ctx, vm)
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
		// Nothing ephemeral on the claim.
		Expect(filepath.Join(filepath.Dir(golden), namespace, vm)).ToNot(BeAnExistingFile())
	}, SpecTimeout(15*time.Minute))

	It("keeps a persistent overlay on the claim and reuses it after stop and start", func(ctx SpecContext) {
		const vm = "hook-persistent"
		overlay := filepath.Join(filepath.Dir(golden), namespace, vm, "rootdisk.qcow2")
		compute := "/var/run/kubevirt-qcow2/store/" + namespace + "/" + vm + "/rootdisk.qcow2"
		Expect(apply(ctx, hookVMYAML(vm, store, `{"name": "rootdisk", "backing": "disk.img", "persistent": true}`))).To(Succeed())
		waitVMIReady(ctx, vm)
		first := waitLinuxDone(ctx, vm)
		Expect(rootdiskSource(ctx, vm)).To(Equal(compute))

		Expect(virtctl(ctx, "-n", namespace, "stop", vm)).Error().ToNot(HaveOccurred())
		waitVMIGone(ctx, vm)
		Expect(checkImage(ctx, overlay).Clean()).To(BeTrue())
		record, err := os.ReadFile(overlay + ".overlay.json")
		Expect(err).ToNot(HaveOccurred())

		Expect(virtctl(ctx, "-n", namespace, "start", vm)).Error().ToNot(HaveOccurred())
		waitVMIReady(ctx, vm)
		// The guest reads back the first boot's pieces through the chain
		// QEMU has open now.
		second := waitLinuxDone(ctx, vm)
		Expect(second.Boot).To(Equal(2))
		Expect(second.Listed).To(Equal(len(first.Published)))
		Expect(rootdiskSource(ctx, vm)).To(Equal(compute))
		logs, err := kubectl(ctx, "-n", namespace, "logs", launcherPod(ctx, vm), "-c", "hook-sidecar-0")
		Expect(err).ToNot(HaveOccurred())
		Expect(logs).To(And(ContainSubstring(`"overlay ready" disk="rootdisk"`), ContainSubstring("created=false")))
		Expect(logs).ToNot(ContainSubstring("created=true"), "the second start made a new overlay")
		Expect(os.ReadFile(overlay + ".overlay.json")).To(Equal(record))
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA), "the golden image changed")

		deleteVM(ctx, vm)
		// The hook never deletes a persistent overlay.
		Expect(overlay).To(BeAnExistingFile())
		Expect(testenv.SHA256(golden)).To(Equal(goldenSHA))
	}, SpecTimeout(20*time.Minute))
})
