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
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// `make bench-migration`: how long a live migration between the two nodes
// takes, its downtime, the memory it sends and all it sends between the
// nodes, for the same guest, idle once it has written its pieces, on each
// kind of root disk. The VMs migrate in turns, back and forth, so load on
// the machine falls on all alike.

const migrationBenchRuns = 5

// benchGuestOrders: the guest writes 16 MiB, then idles, so that an
// overlay holds enough for its copy to show beside the migration's own
// traffic.
const benchGuestOrders = "pieces=2,kib=8192"

// jobStats is what libvirt kept of a domain's last migration. The
// incoming side's statistics do not count what a block migration's disk
// mirror sent, only memory.
type jobStats struct {
	elapsed, downtime time.Duration
	memory            int64
	// crossed is what crossed between the nodes during the migration;
	// allocated what the root disk's top layer held before it.
	crossed, allocated int64
}

var jobLine = regexp.MustCompile(`(?m)^(Time elapsed|Total downtime|Memory processed):\s+([0-9.]+)\s+(\S+)`)

// completedMigration reads libvirt's statistics of the VM's last incoming
// migration, as the target's virt-launcher keeps them.
func completedMigration(ctx context.Context, vm string) jobStats {
	out, err := virsh(ctx, vm, "domjobinfo", "--completed", namespace+"_"+vm)
	Expect(err).ToNot(HaveOccurred())
	units := map[string]float64{"ms": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
	var s jobStats
	for _, m := range jobLine.FindAllStringSubmatch(out, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		Expect(err).ToNot(HaveOccurred())
		unit, ok := units[m[3]]
		Expect(ok).To(BeTrue(), "unit %q in %q", m[3], out)
		switch m[1] {
		case "Time elapsed":
			s.elapsed = time.Duration(v * float64(time.Millisecond))
		case "Total downtime":
			s.downtime = time.Duration(v * float64(time.Millisecond))
		case "Memory processed":
			s.memory = int64(v * unit)
		}
	}
	Expect(s.elapsed).ToNot(BeZero(), "domjobinfo --completed: %q", out)
	return s
}

// betweenNodes is what crossed between the two nodes so far, both ways, in
// bytes: the counters of the second node's link on the first.
func betweenNodes(ctx context.Context) int64 {
	out, err := inNode(ctx, "ip", "-j", "-s", "link", "show", "kvq-node1")
	Expect(err).ToNot(HaveOccurred())
	var links []struct {
		Stats struct {
			RX, TX struct {
				Bytes int64 `json:"bytes"`
			}
		} `json:"stats64"`
	}
	Expect(json.Unmarshal([]byte(out), &links)).To(Succeed())
	Expect(links).To(HaveLen(1))
	return links[0].Stats.RX.Bytes + links[0].Stats.TX.Bytes
}

// rootAllocation is what the VM's root disk has allocated, the top layer
// of a qcow2 chain: what a block migration copies.
func rootAllocation(ctx context.Context, vm string) int64 {
	out, err := virsh(ctx, vm, "domblkinfo", namespace+"_"+vm, "vda")
	Expect(err).ToNot(HaveOccurred())
	m := regexp.MustCompile(`(?m)^Allocation:\s+([0-9]+)`).FindStringSubmatch(out)
	Expect(m).ToNot(BeNil(), "domblkinfo: %q", out)
	n, err := strconv.ParseInt(m[1], 10, 64)
	Expect(err).ToNot(HaveOccurred())
	return n
}

var _ = Describe("live migration between two nodes", Label("bench", twoNodesLabel, linuxGuestLabel), Ordered, func() {
	type disk struct {
		kind, vm, volume string
	}
	disks := []disk{
		{"containerDisk", "bench-migrate-cd", "containerDisk: {image: " + linuxDiskImage + ", imagePullPolicy: Never}"},
		{"overlay", "bench-migrate-overlay", "overlay: {backingPVC: {claimName: bench-migrate-golden}}"},
		{"overlay on RWX", "bench-migrate-overlay-rwx",
			"overlay: {backingPVC: {claimName: bench-migrate-golden}, persistent: true, targetPVC: {claimName: bench-migrate-overlay-rwx}}"},
		{"RWX claim", "bench-migrate-rwx", "persistentVolumeClaim: {claimName: bench-migrate-rwx}"},
	}

	BeforeAll(func(ctx SpecContext) {
		Expect(run(ctx, clusterScript, "import", linuxDiskArchive(ctx, GinkgoT().TempDir()))).To(Succeed())
		guest, err := testenv.LinuxGuestImage(ctx)
		framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
		linuxDiskClaimWithAccess(ctx, "bench-migrate-rwx", 2*fileSize(guest), "ReadWriteMany")
		linuxGolden(ctx, "bench-migrate-golden")
		target := emptyFilesystemClaimWithAccess(ctx, "bench-migrate-overlay-rwx", 2*fileSize(guest), "ReadWriteMany")
		Expect(os.Chown(target, 107, 107)).To(Succeed())
		for _, d := range disks {
			Expect(apply(ctx, linuxVMYAML(d.vm, "Always", benchGuestOrders, d.volume))).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { deleteVM(ctx, d.vm) })
		}
		for _, d := range disks {
			waitVMIReady(ctx, d.vm)
			waitLinuxDone(ctx, d.vm)
		}
	})

	It("takes as long and sends as much for each kind of disk", func(ctx SpecContext) {
		samples := map[string][]jobStats{}
		for range migrationBenchRuns {
			for _, d := range disks {
				allocated, before := rootAllocation(ctx, d.vm), betweenNodes(ctx)
				state := migrate(ctx, d.vm)
				crossed := betweenNodes(ctx) - before
				Expect(state.failed).To(BeFalse(), "%s: %+v", d.kind, state)
				stats := completedMigration(ctx, d.vm)
				stats.crossed, stats.allocated = crossed, allocated
				samples[d.kind] = append(samples[d.kind], stats)
			}
		}
		// median is the median of what of each sample.
		median := func(kind string, what func(jobStats) int64) int64 {
			var v []int64
			for _, s := range samples[kind] {
				v = append(v, what(s))
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		elapsed := func(s jobStats) int64 { return int64(s.elapsed) }
		mib := func(kind string, what func(jobStats) int64) float64 { return float64(median(kind, what)) / (1 << 20) }
		first := median(disks[0].kind, elapsed)
		// Sent beyond memory: the disk's copy, and the protocols' overhead.
		beyondMemory := func(s jobStats) int64 { return s.crossed - s.memory }
		fmt.Printf("\nlive migration, idle Linux guest, medians of %d runs\n%-15s %9s %9s %11s %12s %12s %13s %13s\n",
			migrationBenchRuns, "root disk", "time", "downtime", "memory MiB", "crossed MiB", "beyond MiB", "top layer MiB", "time / first")
		for _, d := range disks {
			took := median(d.kind, elapsed)
			fmt.Printf("%-15s %9s %9s %11.1f %12.1f %12.1f %13.1f %12.2fx\n", d.kind, time.Duration(took).Round(time.Millisecond),
				time.Duration(median(d.kind, func(s jobStats) int64 { return int64(s.downtime) })).Round(time.Millisecond),
				mib(d.kind, func(s jobStats) int64 { return s.memory }), mib(d.kind, func(s jobStats) int64 { return s.crossed }),
				mib(d.kind, beyondMemory), mib(d.kind, func(s jobStats) int64 { return s.allocated }),
				float64(took)/float64(first))
		}
		// The goals of live-migrating overlays: an ephemeral overlay sends
		// little beyond its own clusters and takes about as long as a
		// containerDisk; a persistent one on shared storage as long as a
		// plain shared claim. A shared claim copies no disk: what it sends
		// beyond memory is the migration's own traffic, which the
		// overlay's copy comes on top of.
		fmt.Printf("overlay: copied (beyond memory, less a shared claim's) / top layer %.2f (goal <= 1.1), time / containerDisk %.2f (goal <= 1.2); "+
			"overlay on RWX: time / RWX claim %.2f (goal <= 1.1)\n",
			(mib("overlay", beyondMemory)-mib("RWX claim", beyondMemory))/mib("overlay", func(s jobStats) int64 { return s.allocated }),
			float64(median("overlay", elapsed))/float64(first),
			float64(median("overlay on RWX", elapsed))/float64(median("RWX claim", elapsed)))
	})
})
