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
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Host paths are the cluster administrator's decision: the KubeVirt CR must
// enable HostDisk and list the prefix, and virt-handler resolves the path on
// the node, where a link can lead anywhere.
var _ = Describe("overlay host paths on the node", Ordered, func() {
	const (
		allowed = "/var/lib/e2e-images"
		outside = "/var/lib/e2e-elsewhere"
	)

	BeforeAll(func(ctx SpecContext) {
		image := filepath.Join(volumesDir, "hostpath-golden.img")
		Expect(os.RemoveAll(image)).To(Succeed())
		Expect(os.MkdirAll(volumesDir, 0o755)).To(Succeed())
		Expect(testenv.CreateBootDisk(ctx, image, goldenSize, guestParams)).To(Succeed())
		// Only the node's mount namespace has these directories.
		Expect(inNode(ctx, "sh", "-c", "mkdir -p "+allowed+" "+outside+
			" && cp "+image+" "+allowed+"/golden.raw && cp "+image+" "+outside+"/golden.raw"+
			" && chmod 0644 "+allowed+"/golden.raw "+outside+"/golden.raw"+
			" && ln -sfn "+outside+"/golden.raw "+allowed+"/link.raw")).Error().ToNot(HaveOccurred())

		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HostDisk"},`+
			`{"op":"add","path":"/spec/configuration/overlayVolumes","value":{"allowedHostPathPrefixes":["`+allowed+`"]}}]`)
		// virt-api, virt-controller and virt-handler read the CR through
		// informers: wait until admission takes the path.
		Eventually(func() error {
			_, err := kubectlIn(ctx, vmYAML("probe", "Halted", backingHostPath(allowed+"/golden.raw")), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
	})

	It("boots a VM from an ephemeral overlay over an allowed host path", func(ctx SpecContext) {
		vm := "hostpath-golden"
		Expect(apply(ctx, vmYAML(vm, "Always", backingHostPath(allowed+"/golden.raw")))).To(Succeed())
		waitVMIReady(ctx, vm)
		waitGuestDone(ctx, vm)
		deleteVM(ctx, vm)
	}, SpecTimeout(10*time.Minute))

	It("refuses, on the node, a host path that a link leads out of the allowed prefixes", func(ctx SpecContext) {
		vm := "hostpath-link"
		// Admission reads the text, which lies under the prefix.
		Expect(apply(ctx, vmYAML(vm, "Always", backingHostPath(allowed+"/link.raw")))).To(Succeed())
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o",
				`jsonpath={.status.conditions[?(@.type=="Synchronized")].message}`)
			g.Expect(err).ToNot(HaveOccurred())
			g.Expect(out).To(ContainSubstring("resolves on the node to " + outside + "/golden.raw, which is not under a directory the cluster allows for overlays"))
		}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(2 * time.Second).Should(Succeed())
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi", vm, "-o", "jsonpath={.status.phase}")
		Expect(err).ToNot(HaveOccurred())
		Expect(out).ToNot(Equal("Running"))
		deleteVM(ctx, vm)
	}, SpecTimeout(10*time.Minute))

	It("refuses host paths again once the prefix is gone from the KubeVirt CR", func(ctx SpecContext) {
		_, err := kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "json", "-p",
			`[{"op":"remove","path":"/spec/configuration/overlayVolumes"}]`)
		Expect(err).ToNot(HaveOccurred())
		Eventually(func() error {
			_, err := kubectlIn(ctx, vmYAML("probe", "Halted", backingHostPath(allowed+"/golden.raw")), "create", "--dry-run=server", "-f", "-")
			return err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(MatchError(ContainSubstring("spec.template.spec.volumes[0].overlay.backingHostPath")))
	})
})

func backingHostPath(path string) string {
	return `
overlay:
  backingHostPath: {path: ` + path + `}
  backingFormat: raw`
}
