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

// Package bench measures containerDisk hotplug on this machine, from the
// attachment pod's container serving its socket to the disk attached in the
// running domain, split in the steps measurable here: the container start,
// socket discovery, virt-handler's mount, the launcher's probe and
// conversion, attach-device; and the removal. Side by side, the baseline
// attaches the same image as a plain file disk, with no mount. Run by
// `make bench-hotplug` only (build tag "bench"); it prints a Markdown
// report.
package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/hotplug"
)

const (
	runs   = 50
	volume = "tools"
	domain = "bench"
)

func TestBench(t *testing.T) {
	framework.RunSuite(t, "containerDisk hotplug benchmark")
}

// samples holds the durations of one step over the runs.
type samples struct {
	name string
	d    []time.Duration
}

func (s *samples) add(d time.Duration) { s.d = append(s.d, d) }

func (s *samples) percentile(p float64) time.Duration {
	sorted := slices.Clone(s.d)
	slices.Sort(sorted)
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

var _ = Describe("containerDisk hotplug", Ordered, func() {
	var (
		lv   *testenv.Libvirtd
		node *hotplug.Node
		dir  string
	)

	BeforeAll(func(ctx SpecContext) {
		if os.Geteuid() != 0 {
			Skip("needs root")
		}
		out, err := exec.CommandContext(ctx, "make", "-C", testenv.RepoRoot(), "_out/bin/container-disk").CombinedOutput()
		Expect(err).ToNot(HaveOccurred(), string(out))
		dir, err = os.MkdirTemp("", "hotplug-bench-")
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(os.RemoveAll, dir)
		Expect(hotplug.TreeHasHotplug()).To(Succeed())
		tools, err := hotplug.BuildTools(ctx, filepath.Join(dir, "tools"))
		Expect(err).ToNot(HaveOccurred())

		lv, err = testenv.StartLibvirtd(ctx)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(lv.Stop(ctx)).To(Succeed()) })
		node, err = hotplug.NewNode(tools, testenv.Binary("container-disk"), filepath.Join(dir, "node"), lv.SharedDir())
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(node.Close)
		Expect(hotplug.StartDomain(ctx, lv, dir, domain)).To(Succeed())
	}, NodeTimeout(25*time.Minute))

	It("times add and remove against attaching a plain file disk", func(ctx SpecContext) {
		l, err := hotplug.NewImageLayer(ctx, filepath.Join(dir, "image"), hotplug.RawFile)
		Expect(err).ToNot(HaveOccurred())

		var (
			start     = samples{name: "container start: socket listening"}
			discovery = samples{name: "socket discovery (socket → PID → root mount → image)"}
			mount     = samples{name: "virt-handler Mount (discovery again, CRC32, record, bind mount)"}
			handler   = samples{name: "virt-handler step, wall (incl. process start in its container)"}
			convert   = samples{name: "virt-launcher probe (qemu-img info) and conversion"}
			attach    = samples{name: "attach-device"}
			total     = samples{name: "**add total** (container start to attached)"}
			detach    = samples{name: "detach-device"}
			unmount   = samples{name: "virt-handler Unmount"}
			plain     = samples{name: "**baseline**: attach-device of the image as a plain file disk"}
		)
		for i := 0; i < runs; i++ {
			pod := fmt.Sprintf("attach-%04d", i)
			v := hotplug.Volume{Name: volume, AttachPodUID: pod}

			t0 := time.Now()
			c, err := node.StartContainer(ctx, pod, volume, l)
			Expect(err).ToNot(HaveOccurred())
			t1 := time.Now()
			r, err := node.Mount(ctx, hotplug.VMI("AttachedToNode", v))
			Expect(err).ToNot(HaveOccurred())
			t2 := time.Now()
			disks, err := node.Disks(ctx, hotplug.VMI("MountedToPod", v))
			Expect(err).ToNot(HaveOccurred())
			Expect(disks).To(HaveLen(1))
			t3 := time.Now()
			Expect(hotplug.Attach(ctx, lv, domain, disks[0])).To(Succeed())
			t4 := time.Now()

			start.add(t1.Sub(t0))
			discovery.add(time.Duration(r.DiscoveryNanos[volume]))
			mount.add(time.Duration(r.StepNanos))
			handler.add(t2.Sub(t1))
			convert.add(t3.Sub(t2))
			attach.add(t4.Sub(t3))
			total.add(t4.Sub(t0))

			t5 := time.Now()
			Expect(hotplug.Detach(ctx, lv, domain, disks[0])).To(Succeed())
			t6 := time.Now()
			r, err = node.Unmount(ctx, hotplug.VMI("AttachedToNode"), false)
			Expect(err).ToNot(HaveOccurred())
			detach.add(t6.Sub(t5))
			unmount.add(time.Duration(r.StepNanos))
			Expect(c.Stop(ctx)).To(Succeed())

			// The same image, same bus and flags, with nothing mounted.
			disk := libvirtxml.DomainDisk{}
			Expect(disk.Unmarshal(disks[0])).To(Succeed())
			disk.Source.File.File = l.Image
			xml, err := disk.Marshal()
			Expect(err).ToNot(HaveOccurred())
			t7 := time.Now()
			Expect(hotplug.Attach(ctx, lv, domain, xml)).To(Succeed())
			plain.add(time.Since(t7))
			Expect(hotplug.Detach(ctx, lv, domain, xml)).To(Succeed())
		}

		var rows []string
		for _, s := range []*samples{&start, &discovery, &mount, &handler, &convert, &attach, &total, &detach, &unmount, &plain} {
			rows = append(rows, fmt.Sprintf("| %s | %s | %s |", s.name, ms(s.percentile(0.5)), ms(s.percentile(0.99))))
		}
		fmt.Fprintf(os.Stdout, `
## containerDisk hotplug benchmark (%d runs, %s guest, raw image of %d MiB)

| step | p50 | p99 (of 50: the slowest) |
|---|---|---|
%s

add total / baseline attach (p50): %.1fx; attach-device of the mounted image / of the plain file (p50): %.2fx
`, runs, lv.VirtType(), hotplug.Regions*hotplug.RegionSize>>20, strings.Join(rows, "\n"),
			float64(total.percentile(0.5))/float64(plain.percentile(0.5)),
			float64(attach.percentile(0.5))/float64(plain.percentile(0.5)))
	}, SpecTimeout(30*time.Minute))
})
