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
// takes, its downtime and the memory it sends, for the same guest, idle
// once it has written its pieces, on each kind of root disk. The VMs
// migrate in turns, back and forth, so load on the machine falls on all
// alike.

const migrationBenchRuns = 5

// jobStats is what libvirt kept of a domain's last migration. The
// incoming side's statistics do not count what a block migration's disk
// mirror sent, only memory.
type jobStats struct {
	elapsed, downtime time.Duration
	memory            int64
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

var _ = Describe("live migration between two nodes", Label("bench", twoNodesLabel, linuxGuestLabel), Ordered, func() {
	type disk struct {
		kind, vm, volume string
	}
	disks := []disk{
		{"containerDisk", "bench-migrate-cd", "containerDisk: {image: " + linuxDiskImage + ", imagePullPolicy: Never}"},
		{"RWX claim", "bench-migrate-rwx", "persistentVolumeClaim: {claimName: bench-migrate-rwx}"},
	}

	BeforeAll(func(ctx SpecContext) {
		Expect(run(ctx, clusterScript, "import", linuxDiskArchive(ctx, GinkgoT().TempDir()))).To(Succeed())
		guest, err := testenv.LinuxGuestImage(ctx)
		framework.Require(err, "the Linux test guest (hack/guest-image.sh)")
		linuxDiskClaimWithAccess(ctx, "bench-migrate-rwx", 2*fileSize(guest), "ReadWriteMany")
		for _, d := range disks {
			Expect(apply(ctx, linuxVMYAML(d.vm, "Always", "pieces=2", d.volume))).To(Succeed())
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
				state := migrate(ctx, d.vm)
				Expect(state.failed).To(BeFalse(), "%s: %+v", d.kind, state)
				samples[d.kind] = append(samples[d.kind], completedMigration(ctx, d.vm))
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
		first := median(disks[0].kind, elapsed)
		fmt.Printf("\nlive migration, idle Linux guest, medians of %d runs\n%-14s %10s %10s %12s %14s\n",
			migrationBenchRuns, "root disk", "time", "downtime", "memory MiB", "time / first")
		for _, d := range disks {
			took := median(d.kind, elapsed)
			fmt.Printf("%-14s %10s %10s %12.1f %13.2fx\n", d.kind, time.Duration(took).Round(time.Millisecond),
				time.Duration(median(d.kind, func(s jobStats) int64 { return int64(s.downtime) })).Round(time.Millisecond),
				float64(median(d.kind, func(s jobStats) int64 { return s.memory }))/(1<<20),
				float64(took)/float64(first))
		}
	})
})
