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
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Guests run under TCG where the node has no KVM: generous timeouts.
const (
	startTimeout = 5 * time.Minute
	guestTimeout = 5 * time.Minute
)

// vmYAML is a VirtualMachine booting the test guest from its one disk,
// rootdisk, whose volume source is given as YAML (indented for the
// volume's list entry). No network: the guest has none. The CPU leaves
// out arch-capabilities: on nested hosts whose KVM cannot set that MSR
// (kvm-pvm), QEMU aborts with "failed to set MSR 0x10a" otherwise; the
// test guest never reads it.
func vmYAML(name, runStrategy, volumeSource string) string {
	return guestVMYAML(name, runStrategy, "64Mi", "", volumeSource)
}

// guestVMYAML is vmYAML with the guest's memory and, unless empty, its
// SMBIOS serial.
func guestVMYAML(name, runStrategy, memory, serial, volumeSource string) string {
	firmware := ""
	if serial != "" {
		firmware = fmt.Sprintf("\n        firmware: {serial: %q}", serial)
	}
	return fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: %s, namespace: %s}
spec:
  runStrategy: %s
  template:
    spec:
      terminationGracePeriodSeconds: 0
      domain:
        cpu: {features: [{name: arch-capabilities, policy: disable}]}%s
        resources: {requests: {memory: %s}}
        devices:
          autoattachPodInterface: false
          autoattachGraphicsDevice: false
          disks:
          - name: rootdisk
            disk: {bus: virtio}
      volumes:
      - name: rootdisk
%s
`, name, namespace, runStrategy, firmware, memory, indent(volumeSource, "        "))
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n")
}

// tenant is a VM author of the namespace, as a namespace administrator
// makes one: KubeVirt's and Kubernetes' edit roles, nothing of the cluster.
const tenant = "tenant"

// asTenant makes kubectl act as the tenant.
const asTenant = "--as=system:serviceaccount:" + namespace + ":" + tenant

// createTenant makes the tenant, unless it exists.
func createTenant(ctx context.Context) {
	createServiceAccount(ctx, tenant, "kubevirt.io:edit", "edit")
}

// createServiceAccount makes a service account of the namespace bound to
// the cluster roles in it, unless it exists.
func createServiceAccount(ctx context.Context, name string, clusterRoles ...string) {
	commands := [][]string{{"create", "serviceaccount", name}}
	for _, role := range clusterRoles {
		commands = append(commands, []string{"create", "rolebinding", name + "-" + strings.ReplaceAll(role, ":", "-"),
			"--clusterrole=" + role, "--serviceaccount=" + namespace + ":" + name})
	}
	for _, args := range commands {
		_, err := kubectl(ctx, append([]string{"-n", namespace}, args...)...)
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			Fail(err.Error())
		}
	}
}

// waitVMIReady waits until the VM's VMI is Running and Ready.
func waitVMIReady(ctx context.Context, name string) { waitVMIReadyIn(ctx, namespace, name) }

// waitVMIReadyIn is waitVMIReady for a VM of namespace ns. A VM that does
// not get there fails with what its VMI, pods and events say: CI's output
// is all a failure on another machine leaves.
func waitVMIReadyIn(ctx context.Context, ns, vm string) {
	Eventually(vmiStatus).WithContext(ctx).WithArguments(ns, vm).WithTimeout(startTimeout).WithPolling(2*time.Second).
		Should(Equal("Running True"), func() string { return vmState(ctx, ns, vm) })
}

// vmiStatus is the VM's VMI's phase and Ready condition.
func vmiStatus(ctx context.Context, ns, vm string) string {
	out, _ := kubectl(ctx, "-n", ns, "get", "vmi", vm, "-o",
		`jsonpath={.status.phase} {.status.conditions[?(@.type=="Ready")].status}`)
	return out
}

// vmState says where a VM's start is: its VMI's phase and conditions, its
// pods' phase, conditions and waiting containers, the nodes' conditions
// and taints, and the namespace's last warnings.
func vmState(ctx context.Context, ns, vm string) string {
	var b strings.Builder
	get := func(what string, args ...string) {
		out, err := kubectl(ctx, append([]string{"-n", ns, "get"}, args...)...)
		if err != nil {
			out = err.Error()
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		fmt.Fprintf(&b, "\n%s: %s", what, strings.Join(lines[max(0, len(lines)-10):], "\n"))
	}
	get("VMI", "vmi", vm, "-o", `jsonpath={.status.phase}{range .status.conditions[*]}; {.type}={.status} {.reason} {.message}{end}`)
	get("pods", "pods", "-l", "vm.kubevirt.io/name="+vm, "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.phase}`+
		`{range .status.conditions[?(@.status!="True")]}; {.type} {.reason} {.message}{end}`+
		`{range .status.initContainerStatuses[*].state.waiting}; init waiting {.reason} {.message}{end}`+
		`{range .status.containerStatuses[*].state.waiting}; waiting {.reason} {.message}{end}{"\n"}{end}`)
	get("nodes", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}{range .status.conditions[?(@.status=="True")]} {.type}{end}`+
		`; taints: {.spec.taints[*].key}{"\n"}{end}`)
	// Every pod of this kubelet warns of its missing cluster DNS.
	get("warnings", "events", "--field-selector=type=Warning,reason!=MissingClusterDNS", "--sort-by=.lastTimestamp", "-o",
		`jsonpath={range .items[*]}{.involvedObject.kind}/{.involvedObject.name} {.reason}: {.message}{"\n"}{end}`)
	return b.String()
}

// launcherPod is the name of the VM's running virt-launcher pod.
func launcherPod(ctx context.Context, vm string) string { return launcherPodIn(ctx, namespace, vm) }

// launcherPodIn is the running virt-launcher pod of VM vm in namespace ns.
func launcherPodIn(ctx context.Context, ns, vm string) string {
	out, err := kubectl(ctx, "-n", ns, "get", "pods", "-l", "vm.kubevirt.io/name="+vm,
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
	Expect(err).ToNot(HaveOccurred())
	pods := strings.Fields(out)
	Expect(pods).To(HaveLen(1), "virt-launcher pods of %s", vm)
	return pods[0]
}

// waitGuestDone waits for the test guest's DONE on the serial console, as
// KubeVirt's guest-console-log container shows it.
func waitGuestDone(ctx context.Context, vm string) testenv.GuestStatus {
	pod := launcherPod(ctx, vm)
	var status testenv.GuestStatus
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "logs", pod, "-c", "guest-console-log")
		g.Expect(err).ToNot(HaveOccurred())
		status = testenv.ParseGuestStatus(out)
		g.Expect(status.Finished()).To(BeTrue(), "guest serial so far: %q", out)
	}).WithContext(ctx).WithTimeout(guestTimeout).WithPolling(2 * time.Second).Should(Succeed())
	Expect(status.Failed).To(BeFalse(), "the guest reported INT 13h error %#x", status.Err)
	return status
}

// waitVMIGone waits until a stopped VM has no VMI and no pod.
func waitVMIGone(ctx context.Context, vm string) {
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", namespace, "get", "vmi,pods", "-l", "vm.kubevirt.io/name="+vm, "-o", "name")
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(out).To(BeEmpty())
		out, err = kubectl(ctx, "-n", namespace, "get", "vmi", vm, "--ignore-not-found", "-o", "name")
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(out).To(BeEmpty())
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

// deleteVM deletes the VM and waits until its VMI and pods are gone.
func deleteVM(ctx context.Context, name string) {
	_, err := kubectl(ctx, "-n", namespace, "delete", "vm", name, "--ignore-not-found", "--wait=true", "--timeout=3m")
	Expect(err).ToNot(HaveOccurred())
	waitVMIGone(ctx, name)
}

// Every spec runs on the patched KubeVirt but the upgrade specs, which
// start from stock KubeVirt, and on one node but the two-node specs; the
// namespace of the specs' objects exists.
var _ = BeforeEach(func(ctx SpecContext) {
	want := cluster{patched, 1}
	labels := CurrentSpecReport().Labels()
	if slices.Contains(labels, upgradeLabel) {
		want.kubevirt = stock
	}
	if slices.Contains(labels, twoNodesLabel) {
		want.nodes = 2
	}
	requireCluster(ctx, want)
	_, err := kubectl(ctx, "create", "namespace", namespace)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		Fail(err.Error())
	}
})
