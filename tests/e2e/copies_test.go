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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// patchKubeVirtConfig applies the JSON patch ops to the KubeVirt CR and
// puts its configuration back when the spec's container ends.
func patchKubeVirtConfig(ctx context.Context, ops string) {
	config, err := kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o", "jsonpath={.spec.configuration}")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) {
		_, err := kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "json", "-p",
			`[{"op":"replace","path":"/spec/configuration","value":`+config+`}]`)
		Expect(err).ToNot(HaveOccurred())
	})
	_, err = kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "json", "-p", ops)
	Expect(err).ToNot(HaveOccurred())
}

// Snapshots, exports and clones copy a VM's claims one by one; an overlay
// is no claim, so virt-api refuses them for a VM with overlay volumes.
var _ = Describe("copies of a VM with overlay volumes", Ordered, Label(bootSectorGuestLabel), func() {
	const vm = "copies-overlay"

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"Snapshot"},`+
			`{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"VMExport"}]`)
		Expect(apply(ctx, vmYAML(vm, "Halted", `
overlay:
  backingPVC: {claimName: copies-golden}
  backingFormat: raw`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
	})

	DescribeTable("are refused by virt-api, naming the overlay volumes",
		func(ctx SpecContext, object, message string) {
			// virt-api reads the gates through an informer: until it has
			// them, the refusal names the gate instead.
			Eventually(func() error {
				_, err := kubectlIn(ctx, object, "create", "--dry-run=server", "-f", "-")
				return err
			}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).
				Should(MatchError(ContainSubstring(message + " is not supported yet: its overlay volumes (rootdisk) would be left out or copied without their backing image")))
		},
		Entry("a snapshot", fmt.Sprintf(`
apiVersion: snapshot.kubevirt.io/v1beta1
kind: VirtualMachineSnapshot
metadata: {name: copies-snapshot, namespace: %s}
spec:
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: %s}`, namespace, vm),
			"a snapshot of VirtualMachine "+vm),
		Entry("an export", fmt.Sprintf(`
apiVersion: export.kubevirt.io/v1beta1
kind: VirtualMachineExport
metadata: {name: copies-export, namespace: %s}
spec:
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: %s}`, namespace, vm),
			"an export of VirtualMachine "+vm),
		Entry("a clone", fmt.Sprintf(`
apiVersion: clone.kubevirt.io/v1beta1
kind: VirtualMachineClone
metadata: {name: copies-clone, namespace: %s}
spec:
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: %s}
  target: {apiGroup: kubevirt.io, kind: VirtualMachine, name: copies-clone-target}`, namespace, vm),
			"a clone of VirtualMachine "+vm),
	)
})
