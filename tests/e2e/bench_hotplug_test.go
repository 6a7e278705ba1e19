//go:build bench

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
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The second benchmark of `make bench-e2e`: how long `virtctl addvolume`
// takes until the volume is Ready in the VMI's status, for a containerDisk
// image (--image) against a claim on the same node. The two take turns on
// one running VM, so load on the machine falls on both alike.

const hotplugBenchRuns = 20

var _ = Describe("virtctl addvolume to Ready", Label("bench", bootSectorGuestLabel), Ordered, func() {
	const (
		vm    = "bench-hotplug"
		claim = "bench-hotplug-data"
	)

	BeforeAll(func(ctx SpecContext) {
		patchKubeVirtConfig(ctx, `[{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugVolumes"},`+
			`{"op":"add","path":"/spec/configuration/developerConfiguration/featureGates/-","value":"HotplugContainerDisk"}]`)
		archive, _ := toolsArchive(ctx, GinkgoT().TempDir())
		Expect(run(ctx, clusterScript, "import", archive)).To(Succeed())
		goldenFilesystem(ctx, "bench-hotplug-golden")
		blockClaim(ctx, claim, 16<<20)
		Expect(apply(ctx, vmYAML(vm, "Always", `
overlay:
  backingPVC: {claimName: bench-hotplug-golden}`))).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, vm) })
		waitVMIReady(ctx, vm)
		// The first hotplug of each kind pulls nothing, but starts caches.
		addImage(ctx, vm, toolsVolume)
		removeVolume(ctx, vm, toolsVolume)
	})

	It("compares a containerDisk image with a claim", func(ctx SpecContext) {
		timeToReady := func(volume string, args ...string) time.Duration {
			start := time.Now()
			_, err := virtctl(ctx, append([]string{"-n", namespace, "addvolume", vm, "--volume-name=" + volume}, args...)...)
			Expect(err).ToNot(HaveOccurred())
			Eventually(func() (string, error) {
				return volumePhase(ctx, vm, volume)
			}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(benchPoll).Should(Equal("Ready"))
			took := time.Since(start)
			removeVolume(ctx, vm, volume)
			Eventually(func() []string { return attachmentPods(ctx) }).
				WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(BeEmpty())
			return took
		}
		var image, pvc []time.Duration
		for range hotplugBenchRuns {
			image = append(image, timeToReady(toolsVolume, "--image="+toolsImage))
			pvc = append(pvc, timeToReady(claim))
		}
		reportHotplugBench(image, pvc)
	}, SpecTimeout(60*time.Minute))
})

func reportHotplugBench(image, pvc []time.Duration) {
	fmt.Printf("\nvirtctl addvolume to Ready in the VMI status, %d runs each, status read every %s\n",
		hotplugBenchRuns, benchPoll)
	fmt.Printf("%-22s %10s %10s\n", "volume", "p50", "p99")
	for _, row := range []struct {
		name    string
		samples []time.Duration
	}{{"claim", pvc}, {"containerDisk --image", image}} {
		fmt.Printf("%-22s %10s %10s\n", row.name, percentile(row.samples, 50).Round(time.Millisecond),
			percentile(row.samples, 99).Round(time.Millisecond))
	}
	fmt.Printf("containerDisk / claim: p50 %.2fx, p99 %.2fx (goal: p99 within 1.5x)\n",
		float64(percentile(image, 50))/float64(percentile(pvc, 50)),
		float64(percentile(image, 99))/float64(percentile(pvc, 99)))
}
