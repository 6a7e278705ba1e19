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
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// The benchmark of `make bench-e2e`: how long from creating a VM to the
// guest's first serial line, and from there until the guest wrote
// benchGuestParams' MiB into the root disk (its first writes, clusters
// an overlay allocates as they come), with its root disk
//   - an ephemeral overlay over the golden claim,
//   - the golden image as a plain disk on a claim of its own (a copy made
//     beforehand, as a user without overlays keeps one per VM),
//   - a full copy of the golden image made first, then started (copy in
//     the time).
// The kinds take turns, so load on the machine falls on all alike.

// benchGuestParams: the guest writes 4 MiB after the golden image's first
// MiB, 127 sectors a call.
var benchGuestParams = testenv.GuestParams{StartLBA: 2048, Sectors: 8192, SectorsPerCall: 127, Seed: 0xbe4c}

const (
	benchRuns       = 10
	benchGoldenSize = 1 << 30
	// How often the serial log is read: the resolution of every sample.
	benchPoll = 200 * time.Millisecond
)

var _ = Describe("start to first serial line", Label("bench", bootSectorGuestLabel), Ordered, func() {
	var golden string

	BeforeAll(func(ctx SpecContext) {
		// A golden image full of data, as a real one is: a copy moves
		// every byte.
		dir := filepath.Join(volumesDir, "bench-golden")
		Expect(os.RemoveAll(dir)).To(Succeed())
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		golden = filepath.Join(dir, "disk.img")
		Expect(exec.CommandContext(ctx, "dd", "if=/dev/urandom", "of="+golden, "bs=4M",
			fmt.Sprintf("count=%d", benchGoldenSize>>22), "status=none").Run()).To(Succeed())
		Expect(testenv.WriteBootSector(ctx, golden, "raw", benchGuestParams)).To(Succeed())
		localClaim(ctx, "bench-golden", dir, "Filesystem", "ReadOnlyMany", benchGoldenSize)
	})

	It("compares an overlay VM with a plain-disk VM and with copy-then-start", func(ctx SpecContext) {
		samples, writes := map[string][]time.Duration{}, map[string][]time.Duration{}
		sample := func(kind, vm, volumeSource string, prepare func()) {
			serial, written := timeToSerial(ctx, vm, volumeSource, prepare)
			samples[kind] = append(samples[kind], serial)
			writes[kind] = append(writes[kind], written)
		}
		for run := range benchRuns {
			copyName := fmt.Sprintf("bench-copy-%d", run)
			copyDir := copyGolden(ctx, golden, copyName)
			localClaim(ctx, copyName, copyDir, "Filesystem", "ReadWriteOnce", benchGoldenSize)

			sample("overlay", "bench-overlay", `
overlay:
  backingPVC: {claimName: bench-golden}
  backingFormat: raw`, nil)
			sample("plain disk", "bench-plain", "persistentVolumeClaim: {claimName: "+copyName+"}", nil)

			fullName := fmt.Sprintf("bench-full-%d", run)
			sample("copy, then start", "bench-full", "persistentVolumeClaim: {claimName: "+fullName+"}", func() {
				dir := copyGolden(ctx, golden, fullName)
				localClaim(ctx, fullName, dir, "Filesystem", "ReadWriteOnce", benchGoldenSize)
			})
			for _, name := range []string{copyName, fullName} {
				Expect(kubectl(ctx, "-n", namespace, "delete", "pvc", name, "--wait=false")).Error().ToNot(HaveOccurred())
				Expect(kubectl(ctx, "delete", "pv", name, "--wait=false")).Error().ToNot(HaveOccurred())
				Expect(os.RemoveAll(filepath.Join(volumesDir, name))).To(Succeed())
			}
		}
		fmt.Printf("\n%d runs each, golden image %d MiB, serial read every %s\n", benchRuns, benchGoldenSize>>20, benchPoll)
		benchTable("create VM to first serial line", samples)
		benchTable(fmt.Sprintf("first serial line to %d MiB written", benchGuestParams.Sectors>>11), writes)
	}, SpecTimeout(60*time.Minute))
})

// benchTable prints the percentiles of each kind of root disk and their
// ratio to the plain disk's.
func benchTable(title string, samples map[string][]time.Duration) {
	plain := percentile(samples["plain disk"], 50)
	fmt.Printf("\n%s\n%-18s %10s %10s %16s\n", title, "root disk", "p50", "p99", "p50 / plain disk")
	for _, kind := range []string{"plain disk", "overlay", "copy, then start"} {
		p50, p99 := percentile(samples[kind], 50), percentile(samples[kind], 99)
		fmt.Printf("%-18s %10s %10s %15.2fx\n", kind, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
			float64(p50)/float64(plain))
	}
}

// copyGolden copies the golden image into a new directory of its own, as a
// user without overlays gives each VM its disk.
func copyGolden(ctx context.Context, golden, name string) string {
	dir := filepath.Join(volumesDir, name)
	Expect(os.RemoveAll(dir)).To(Succeed())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	Expect(exec.CommandContext(ctx, "cp", "--sparse=always", golden, filepath.Join(dir, "disk.img")).Run()).To(Succeed())
	Expect(os.Chmod(filepath.Join(dir, "disk.img"), 0o666)).To(Succeed())
	return dir
}

// timeToSerial creates a VM running the guest from the given root volume,
// after prepare (timed too) when given, and returns the time until the
// guest's first serial line and from there until it wrote all it writes;
// the VM is deleted afterwards.
func timeToSerial(ctx context.Context, vm, volumeSource string, prepare func()) (serial, written time.Duration) {
	start := time.Now()
	if prepare != nil {
		prepare()
	}
	Expect(apply(ctx, vmYAML(vm, "Always", volumeSource))).To(Succeed())
	var started time.Time
	Eventually(func(g Gomega) {
		pods, err := kubectl(ctx, "-n", namespace, "get", "pods", "-l", "vm.kubevirt.io/name="+vm,
			"-o", "jsonpath={.items[*].metadata.name}")
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(pods).ToNot(BeEmpty())
		out, err := kubectl(ctx, "-n", namespace, "logs", strings.Fields(pods)[0], "-c", "guest-console-log")
		g.Expect(err).ToNot(HaveOccurred())
		// KubeVirt's log holds the last line's end back: DONE is read
		// without it.
		status := testenv.ParseGuestStatus(out)
		g.Expect(status.Started).To(BeTrue())
		if started.IsZero() {
			started = time.Now()
		}
		if status.Failed {
			StopTrying(fmt.Sprintf("the guest's write failed: INT 13h status %#x", status.Err)).Now()
		}
		g.Expect(status.Done).To(BeTrue())
	}).WithContext(ctx).WithTimeout(startTimeout).WithPolling(benchPoll).Should(Succeed())
	written = time.Since(started)
	deleteVM(ctx, vm)
	return started.Sub(start), written
}

func percentile(samples []time.Duration, p int) time.Duration {
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}
