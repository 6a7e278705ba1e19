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

// Package bench measures thin provisioning on this machine: the latency
// of one extension (threshold event to QEMU seeing the grown device) and
// the highest write rate a disk sustains without an ENOSPC pause for
// chunks of 256 MiB and 1 GiB. Run by `make bench` only (build tag
// "bench"); it prints a Markdown report.
package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirt"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/thinp/testbed"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// step is the size of one host-side write.
	step = 8 * mib
)

// shmDir is a directory on tmpfs for one spec.
func shmDir() string {
	dir, err := os.MkdirTemp("/dev/shm", "thinp-bench-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	return dir
}

func TestBench(t *testing.T) {
	framework.RunSuite(t, "thinp benchmark")
}

var (
	env *testbed.Env
	// Rows of the report's two tables.
	latencyRows, rateRows []string
)

var _ = BeforeSuite(func(ctx context.Context) {
	env = testbed.StartEnv(ctx)
}, NodeTimeout(2*time.Minute))

var _ = AfterSuite(func() {
	fmt.Fprintf(os.Stdout, `
## thinp benchmark (%s guests)

### Extension latency: threshold event to new size visible to QEMU (loop device, 1 MiB chunks, test guest at full speed)

| samples | p50 | p99 | max | guest write rate | ENOSPC pauses |
|---|---|---|---|---|---|
%s

### Write rate without ENOSPC (host-side writes through QEMU, 8 MiB each, tmpfs-backed loop device)

| chunk | written | rate | extensions | failed writes | latency p50 | latency max |
|---|---|---|---|---|---|---|
%s
`, os.Getenv(testenv.VirtTypeEnv), strings.Join(latencyRows, "\n"), strings.Join(rateRows, "\n"))
})

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

func latencies(exts []thinp.Extension, trigger thinp.Trigger) []time.Duration {
	var l []time.Duration
	for _, e := range exts {
		if e.Err == nil && e.Trigger == trigger {
			l = append(l, e.Latency)
		}
	}
	slices.Sort(l)
	return l
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func mibps(bytes int64, d time.Duration) float64 {
	return float64(bytes) / float64(mib) / d.Seconds()
}

var _ = Describe("thin provisioning", Ordered, func() {
	It("extension latency: threshold event to new size visible to QEMU, test guest at full speed", func(ctx context.Context) {
		const written = 48 * mib
		g := env.StartGuest(ctx, testbed.GuestOptions{
			Name: "bench-latency", VirtualSize: gib, DeviceSize: 2 * mib, Dir: GinkgoT().TempDir(),
			Writer: testenv.GuestParams{StartLBA: 1, Sectors: uint32(written / testenv.SectorSize), ProgressEvery: 64, Seed: 1},
		})
		start := time.Now()
		m := g.StartMonitor(testbed.MonitorOptions{Policy: thinp.Policy{ChunkSize: mib, FreeThreshold: mib / 2}})
		g.Wait(ctx)
		took := time.Since(start)
		l := latencies(m.Extensions(), thinp.TriggerThreshold)
		Expect(len(l)).To(BeNumerically(">=", 20))
		latencyRows = append(latencyRows, fmt.Sprintf("| %d | %s | %s | %s | %.1f MiB/s | %d |", len(l), ms(percentile(l, 0.5)), ms(percentile(l, 0.99)), ms(l[len(l)-1]),
			mibps(written, took), len(latencies(m.Extensions(), thinp.TriggerNoSpace))))
		g.Verify(ctx)
	}, NodeTimeout(10*time.Minute))

	// The test guest writes through BIOS calls at a few MiB/s at most,
	// far below what chunks of 256 MiB and 1 GiB are for: the rate runs
	// write from the host into the running disk through QEMU's own block
	// layer (HMP qemu-io on the disk's device), which crosses thresholds
	// and fills the device exactly as guest writes do, but reports ENOSPC
	// as a failed write instead of pausing the guest.
	DescribeTable("highest write rate without ENOSPC",
		func(ctx context.Context, chunk, total int64) {
			g := env.StartGuest(ctx, testbed.GuestOptions{
				// Memory-backed, so that the disk, not the machine's
				// storage, is what is measured.
				Name: fmt.Sprintf("bench-rate-%d", chunk/mib), VirtualSize: total + gib, DeviceSize: chunk, Dir: shmDir(),
				Writer: testenv.GuestParams{StartLBA: 1, Sectors: 1, Seed: 2},
			})
			g.Wait(ctx)
			m := g.StartMonitor(testbed.MonitorOptions{Policy: thinp.Policy{ChunkSize: chunk}})
			Eventually(m.State).WithArguments(testbed.Target).Should(Equal(thinp.StateArmed))

			dom, err := env.Conn.LookupDomainByName(g.Opts.Name)
			Expect(err).ToNot(HaveOccurred())
			DeferCleanup(dom.Free)
			start := time.Now()
			for off := mib; off < mib+total; off += step {
				// qemu-io holds QEMU's main loop for the whole write, so
				// writes are kept short: events and block info wait.
				cmd := fmt.Sprintf(`qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "write -P 0x5a %d %d"`, off, step)
				_, err := dom.QemuMonitorCommand(cmd, libvirt.DOMAIN_QEMU_MONITOR_COMMAND_HMP)
				Expect(err).ToNot(HaveOccurred())
			}
			took := time.Since(start)
			// qemu-io reports to QEMU's standard output, which libvirt logs.
			log, err := os.ReadFile(env.Libvirtd.QEMULog(g.Opts.Name))
			Expect(err).ToNot(HaveOccurred())
			Expect(strings.Count(string(log), "wrote ")).To(BeNumerically(">", 0), "qemu-io reported no writes")
			enospc := strings.Count(string(log), "write failed")
			Expect(g.Usage().Allocation).To(BeNumerically(">=", total))
			l := latencies(m.Extensions(), thinp.TriggerThreshold)
			rateRows = append(rateRows, fmt.Sprintf("| %d MiB | %d MiB | %.0f MiB/s | %d | %d | %s | %s |",
				chunk/mib, total/mib, mibps(total, took), len(m.Extensions()), enospc, ms(percentile(l, 0.5)), ms(percentile(l, 1))))
			Expect(enospc).To(BeZero(), "writes failed for lack of space")
		},
		Entry(nil, 256*mib, gib+512*mib, NodeTimeout(10*time.Minute)),
		Entry(nil, gib, 3*gib, NodeTimeout(15*time.Minute)),
	)
})
