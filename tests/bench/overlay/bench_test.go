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

// Package overlay measures what overlay volumes cost on this machine:
// provisioning a VM disk from a golden image as a qcow2 overlay
// (pkg/qcow2 CreateOverlay) against a full copy (qemu-img convert) at 1, 4
// and 16 GiB of real content, and the first writes into a fresh overlay for
// the qcow2 creation options worth considering, over a raw and a qcow2
// backing. Run by `make bench` only (build tag "bench"); it prints a
// Markdown report and asserts nothing about time.
package overlay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30

	// overlayRuns is how often an overlay is created per size; the median
	// is reported.
	overlayRuns = 9
	// firstWriteRuns is how often each first-write workload runs, each time
	// on a fresh overlay; the median is reported.
	firstWriteRuns = 5
	// firstWriteBacking is the size of the backings of the first-write
	// comparison.
	firstWriteBacking = 1 * gib
)

// goldenSizes are the golden images of the provisioning comparison.
var goldenSizes = []int64{1 * gib, 4 * gib, 16 * gib}

func TestBench(t *testing.T) {
	framework.RunSuite(t, "overlay volume benchmark")
}

var (
	tool qcow2.Tool
	// Rows of the report's tables.
	provisionRows, firstWriteRows []string
)

var _ = AfterSuite(func() {
	fmt.Fprintf(os.Stdout, `
## Overlay volume benchmark

### Provisioning a VM disk from a golden image filled with data (raw)

| golden image | overlay (CreateOverlay, median of %d) | overlay file | full copy (qemu-img convert -t none -T none) | copy file | copy / overlay |
|---|---|---|---|---|---|
%s

### First writes into a fresh overlay (qemu-img bench -w -t none, median of %d fresh overlays)

4k-random: 4 KiB writes at depth 1, one per MiB over %d MiB, so every write lands in a cluster no earlier write touched (latency = run time / writes).
64k-stream: 64 KiB sequential writes at depth 4 over the first 256 MiB (throughput).

| backing | overlay options | 4k-random latency | 4k-random writes/s | 64k-stream MiB/s | overlay size after 64k-stream |
|---|---|---|---|---|---|
%s
`, overlayRuns, strings.Join(provisionRows, "\n"), firstWriteRuns, firstWriteBacking/mib, strings.Join(firstWriteRows, "\n"))
})

// workDir is a directory for one spec, removed after it, on the file system
// of TMPDIR, which must have need bytes free.
func workDir(need int64) string {
	dir, err := os.MkdirTemp("", "overlay-bench-")
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	var fs unix.Statfs_t
	Expect(unix.Statfs(dir, &fs)).To(Succeed())
	if free := int64(fs.Bavail) * fs.Bsize; free < need {
		Skip(fmt.Sprintf("%s has %d GiB free, the benchmark needs %d GiB", filepath.Dir(dir), free/gib, need/gib))
	}
	return dir
}

// fillRaw creates a raw image of size bytes whose every byte is written
// (0xa5), so that copies of it cost what a real golden image's would.
func fillRaw(ctx context.Context, path string, size int64) {
	_, err := testenv.QemuImg(ctx, "create", "-q", "-f", "raw", path, strconv.FormatInt(size, 10))
	Expect(err).ToNot(HaveOccurred())
	const chunk = 4 * mib
	benchRun(ctx, "-f", "raw", "-w", "-c", strconv.FormatInt(size/chunk, 10), "-s", strconv.FormatInt(chunk, 10),
		"-d", "8", "-t", "none", "--pattern=0xa5", path)
	// Nothing of the fill may still be on its way to disk while the next
	// measurement syncs.
	unix.Sync()
}

var runCompleted = regexp.MustCompile(`Run completed in ([0-9.]+) seconds`)

// benchRun runs qemu-img bench and returns the run time it reports.
func benchRun(ctx context.Context, args ...string) time.Duration {
	out, err := testenv.QemuImg(ctx, append([]string{"bench"}, args...)...)
	Expect(err).ToNot(HaveOccurred())
	m := runCompleted.FindStringSubmatch(out)
	Expect(m).To(HaveLen(2), out)
	seconds, err := strconv.ParseFloat(m[1], 64)
	Expect(err).ToNot(HaveOccurred())
	return time.Duration(seconds * float64(time.Second))
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

func median(samples []time.Duration) time.Duration {
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

func round(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(100 * time.Nanosecond).String()
	}
}

var _ = Describe("provisioning a VM disk from a golden image", Ordered, func() {
	var overlayMedians []time.Duration

	DescribeTable("overlay against full copy",
		func(ctx context.Context, size int64) {
			// The golden image, its copy and some room.
			dir := workDir(2*size + 2*gib)
			golden := filepath.Join(dir, "golden.raw")
			fillRaw(ctx, golden, size)

			var overlays []time.Duration
			for i := range overlayRuns {
				path := filepath.Join(dir, fmt.Sprintf("vm%d.qcow2", i))
				overlays = append(overlays, timed(func() {
					Expect(tool.CreateOverlay(ctx, path, golden, qcow2.FormatRaw, qcow2.CreateOptions{})).To(Succeed())
				}))
			}
			overlay := median(overlays)
			overlayMedians = append(overlayMedians, overlay)
			overlayInfo, err := tool.Info(ctx, filepath.Join(dir, "vm0.qcow2"), qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
			Expect(err).ToNot(HaveOccurred())
			unix.Sync()

			// O_DIRECT on both sides: the golden image just written is in
			// the page cache, a real one on a node mostly is not, and the
			// copy is only done when it is on disk.
			copyPath := filepath.Join(dir, "vm-copy.raw")
			copied := timed(func() {
				_, err := testenv.QemuImg(ctx, "convert", "-f", "raw", "-O", "raw", "-T", "none", "-t", "none", golden, copyPath)
				Expect(err).ToNot(HaveOccurred())
			})
			info, err := tool.Info(ctx, copyPath, qcow2.InfoOptions{Format: qcow2.FormatRaw})
			Expect(err).ToNot(HaveOccurred())
			Expect(info.ActualSize).To(BeNumerically(">=", size), "the copy holds every byte")

			provisionRows = append(provisionRows, fmt.Sprintf("| %d GiB | %s | %d KiB | %s | %d MiB | %.0fx |",
				size/gib, round(overlay), overlayInfo.ActualSize/kib, round(copied), info.ActualSize/mib, float64(copied)/float64(overlay)))
		},
		Entry("1 GiB", 1*gib, NodeTimeout(10*time.Minute)),
		Entry("4 GiB", 4*gib, NodeTimeout(20*time.Minute)),
		Entry("16 GiB", 16*gib, NodeTimeout(40*time.Minute)),
	)

	AfterAll(func() {
		if len(overlayMedians) == len(goldenSizes) {
			provisionRows = append(provisionRows, fmt.Sprintf("| overlay 16 GiB / 1 GiB | %.2f | | | | |",
				float64(overlayMedians[2])/float64(overlayMedians[0])))
		}
	})
})

// overlayOption is one set of qcow2 creation options for the overlay.
type overlayOption struct {
	name string
	opts qcow2.CreateOptions
}

var overlayOptions = []overlayOption{
	{"default (64k clusters)", qcow2.CreateOptions{}},
	{"cluster_size=128k", qcow2.CreateOptions{ClusterSize: 128 * kib}},
	{"cluster_size=256k", qcow2.CreateOptions{ClusterSize: 256 * kib}},
	{"cluster_size=1M", qcow2.CreateOptions{ClusterSize: 1 * mib}},
	{"cluster_size=128k, extended_l2=on", qcow2.CreateOptions{ClusterSize: 128 * kib, ExtendedL2: true}},
	{"lazy_refcounts=on", qcow2.CreateOptions{LazyRefcounts: true}},
}

var _ = Describe("first writes into a fresh overlay", Ordered, func() {
	var dir string
	backings := map[string]string{}

	BeforeAll(func(ctx context.Context) {
		dir = workDir(3 * firstWriteBacking)
		raw := filepath.Join(dir, "golden.raw")
		fillRaw(ctx, raw, firstWriteBacking)
		backings[qcow2.FormatRaw] = raw
		qcow := filepath.Join(dir, "golden.qcow2")
		Expect(tool.Convert(ctx, raw, qcow2.FormatRaw, qcow, qcow2.FormatQcow2)).To(Succeed())
		backings[qcow2.FormatQcow2] = qcow
	}, NodeTimeout(10*time.Minute))

	for _, format := range []string{qcow2.FormatRaw, qcow2.FormatQcow2} {
		for _, option := range overlayOptions {
			It(fmt.Sprintf("over a %s backing with %s", format, option.name), func(ctx context.Context) {
				backing := backings[format]
				fresh := func(run int) string {
					path := filepath.Join(dir, fmt.Sprintf("overlay-%d.qcow2", run))
					Expect(os.RemoveAll(path)).To(Succeed())
					Expect(tool.CreateOverlay(ctx, path, backing, format, option.opts)).To(Succeed())
					return path
				}

				const randomStep = 1 * mib
				randomWrites := firstWriteBacking / randomStep
				var random, stream []time.Duration
				var streamSize int64
				for run := range firstWriteRuns {
					random = append(random, benchRun(ctx, "-f", "qcow2", "-w", "-t", "none", "--pattern=0x5a",
						"-c", strconv.FormatInt(randomWrites, 10), "-s", "4k", "-S", strconv.FormatInt(randomStep, 10), "-d", "1",
						fresh(run)))

					const streamBytes, streamBuf = 256 * mib, 64 * kib
					path := fresh(run)
					stream = append(stream, benchRun(ctx, "-f", "qcow2", "-w", "-t", "none", "--pattern=0x5a",
						"-c", strconv.FormatInt(streamBytes/streamBuf, 10), "-s", strconv.FormatInt(streamBuf, 10), "-d", "4",
						path))
					info, err := tool.Info(ctx, path, qcow2.InfoOptions{Format: qcow2.FormatQcow2, NoBacking: true})
					Expect(err).ToNot(HaveOccurred())
					streamSize = info.ActualSize
				}
				latency := median(random) / time.Duration(randomWrites)
				writesPerSecond := float64(randomWrites) / median(random).Seconds()
				streamRate := float64(256) / median(stream).Seconds()
				firstWriteRows = append(firstWriteRows, fmt.Sprintf("| %s | %s | %s | %.0f | %.0f | %d MiB |",
					format, option.name, round(latency), writesPerSecond, streamRate, streamSize/mib))
			}, NodeTimeout(10*time.Minute))
		}
	}
})

// qemuImgAvailable fails early with a clear message when qemu-img is missing.
var _ = BeforeSuite(func() {
	_, err := exec.LookPath("qemu-img")
	framework.Require(err, "qemu-img")
})
