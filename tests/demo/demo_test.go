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

package demo_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

const mib = 1 << 20

// output runs cmd and returns what it printed on standard output and
// error.
func output(cmd *exec.Cmd) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	GinkgoWriter.Print(stdout.String(), stderr.String())
	return stdout.String(), stderr.String(), err
}

// run runs the demo with args and returns what it printed on standard
// error.
func run(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, demo, args...)
	cmd.Env = append(os.Environ(), env...)
	_, stderr, err := output(cmd)
	return stderr, err
}

// runDocumented runs a command line of the docs as a user types it, in
// the tree's root.
func runDocumented(ctx context.Context, line string) (string, string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = testenv.RepoRoot()
	return output(cmd)
}

// row is one disk of a disk usage table.
type row struct {
	kind, format       string
	virtual, allocated int64
}

var rowLine = regexp.MustCompile(`^\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+) MiB\s+[\d.]+ MiB\s+(\d+)$`)

// tables parses the disk usage file: one table per moment, by disk name.
func tables(text string) []map[string]row {
	GinkgoHelper()
	var all []map[string]row
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "disk usage ") {
			all = append(all, map[string]row{})
			continue
		}
		m := rowLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		Expect(all).ToNot(BeEmpty(), "a row before any table: %q", line)
		virtual, err := strconv.ParseInt(m[4], 10, 64)
		Expect(err).ToNot(HaveOccurred())
		allocated, err := strconv.ParseInt(m[5], 10, 64)
		Expect(err).ToNot(HaveOccurred())
		all[len(all)-1][m[1]] = row{kind: m[2], format: m[3], virtual: virtual * mib, allocated: allocated}
	}
	return all
}

// images reads a domain XML the demo wrote: its overlay and the backing.
func images(path string) (string, string) {
	GinkgoHelper()
	data, err := os.ReadFile(path)
	Expect(err).ToNot(HaveOccurred())
	dom := &libvirtxml.Domain{}
	Expect(dom.Unmarshal(string(data))).To(Succeed())
	Expect(dom.Devices.Disks).To(HaveLen(1))
	disk := dom.Devices.Disks[0]
	return disk.Source.File.File, disk.BackingStore.Source.File.File
}

// processesNaming lists the processes whose command line names path.
func processesNaming(path string) []string {
	GinkgoHelper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	Expect(err).ToNot(HaveOccurred())
	var found []string
	for _, file := range cmdlines {
		data, err := os.ReadFile(file)
		if err == nil && bytes.Contains(data, []byte(path)) {
			found = append(found, string(bytes.ReplaceAll(data, []byte{0}, []byte{' '})))
		}
	}
	return found
}

var _ = Describe("the local demo", func() {
	It("runs end to end as docs/demo.md tells, and its table and chart agree with the images it keeps", func(ctx SpecContext) {
		// The commands of "Output files" as written, one at a time: the
		// demo keeping its images, a look at one, their removal.
		blocks, err := testenv.DocShellBlocks("docs/demo.md", "## Output files")
		Expect(err).ToNot(HaveOccurred())
		Expect(blocks).To(HaveLen(1))
		lines := strings.Split(strings.TrimSpace(blocks[0]), "\n")
		Expect(lines).To(HaveLen(3))
		out, work := filepath.Join(testenv.OutDir(), "demo"), filepath.Join(testenv.OutDir(), "demo-images")
		Expect(work).ToNot(BeAnExistingFile(), "left by an earlier run")
		Expect(lines[0]).To(ContainSubstring("-work _out/demo-images -keep-images"))
		Expect(lines[2]).To(Equal("rm -r _out/demo-images"))
		DeferCleanup(func() { Expect(os.RemoveAll(work)).To(Succeed()) })
		stdout, stderr, err := runDocumented(ctx, lines[0])
		Expect(err).ToNot(HaveOccurred(), stderr)

		By("printing numbered steps, one line each, the last one the teardown")
		steps := regexp.MustCompile(`(?m)^\s*(\d+)\. \[\s*[\d.]+s\] (.*)$`).FindAllStringSubmatch(stdout, -1)
		Expect(len(steps)).To(BeNumerically(">=", 10))
		for i, step := range steps {
			Expect(step[1]).To(Equal(strconv.Itoa(i + 1)))
		}
		Expect(steps[len(steps)-1][2]).To(HavePrefix("tore down"))
		Expect(stdout).To(ContainSubstring("each holds its own guest's pattern and none of the others'"))
		Expect(stdout).To(ContainSubstring("golden image unchanged"))

		By("leaving no domain, QEMU or mount behind")
		Expect(processesNaming(work)).To(BeEmpty())
		mounts, err := testenv.MountPoints()
		Expect(err).ToNot(HaveOccurred())
		for _, m := range mounts {
			Expect(m.MountPoint).ToNot(HavePrefix(work))
		}

		By("writing a chart that decodes")
		f, err := os.Open(filepath.Join(out, "disk-usage.png"))
		Expect(err).ToNot(HaveOccurred())
		defer f.Close()
		img, err := png.Decode(f)
		Expect(err).ToNot(HaveOccurred())
		Expect(img.Bounds().Dx()).To(BeNumerically(">=", 400))
		Expect(img.Bounds().Dy()).To(BeNumerically(">=", 200))

		By("writing the tables the demo printed, the last one as the kept images are")
		text, err := os.ReadFile(filepath.Join(out, "disk-usage.txt"))
		Expect(err).ToNot(HaveOccurred())
		Expect(stdout).To(ContainSubstring(string(text[:bytes.IndexByte(text, '\n')])))
		all := tables(string(text))
		Expect(all).To(HaveLen(2))
		for _, table := range all {
			Expect(table).To(HaveLen(4))
			Expect(table).To(HaveKey("golden"))
			for _, r := range table {
				Expect(r.virtual).To(Equal(table["golden"].virtual))
			}
		}
		first, last := all[0], all[1]
		Expect(first["vm-a"].allocated).To(BeNumerically("<", first["vm-b"].allocated))
		Expect(first["vm-b"].allocated).To(BeNumerically("<", first["vm-c"].allocated))
		Expect(last["vm-c"].allocated).To(BeNumerically(">", first["vm-c"].allocated), "the persistent overlay grew")
		Expect(last["vm-a"].allocated).To(BeNumerically("<", first["vm-a"].allocated), "the ephemeral overlay started over")

		tool := qcow2.Tool{}
		var golden string
		for _, name := range []string{"vm-a", "vm-b", "vm-c"} {
			overlay, backing := images(filepath.Join(out, name+".xml"))
			Expect(overlay).To(HavePrefix(work))
			golden = backing
			info, err := tool.Info(ctx, overlay, qcow2.InfoOptions{Format: "qcow2", NoBacking: true})
			Expect(err).ToNot(HaveOccurred())
			Expect(last[name]).To(Equal(row{kind: last[name].kind, format: "qcow2", virtual: info.VirtualSize, allocated: info.ActualSize}), name)
		}
		Expect(last["vm-c"].kind).To(Equal("persistent"))
		Expect(last["vm-a"].kind).To(Equal("ephemeral"))
		info, err := tool.Info(ctx, golden, qcow2.InfoOptions{Format: "raw"})
		Expect(err).ToNot(HaveOccurred())
		Expect(last["golden"]).To(Equal(row{kind: "backing", format: "raw", virtual: info.VirtualSize, allocated: info.ActualSize}))

		By("showing the kept overlay's backing file as the pod sees it, then removing the images")
		stdout, stderr, err = runDocumented(ctx, lines[1])
		Expect(err).ToNot(HaveOccurred(), stderr)
		Expect(stdout).To(MatchRegexp(`(?m)^backing file: /var/run/kubevirt-private/`))
		_, stderr, err = runDocumented(ctx, lines[2])
		Expect(err).ToNot(HaveOccurred(), stderr)
		Expect(work).ToNot(BeAnExistingFile())
	}, SpecTimeout(15*time.Minute))

	It("names what is missing and creates nothing", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		out := filepath.Join(dir, "out")
		stderr, err := run(ctx, []string{"KUBEVIRT_TREE=" + filepath.Join(dir, "no-tree")}, "-out", out)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("no patched KubeVirt tree at " + filepath.Join(dir, "no-tree")))
		Expect(stderr).To(ContainSubstring("run `make` first"))
		Expect(out).ToNot(BeAnExistingFile())
	}, SpecTimeout(time.Minute))

	It("refuses a work directory that exists and leaves it alone", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		precious := filepath.Join(dir, "precious")
		Expect(os.WriteFile(precious, []byte("not the demo's"), 0o644)).To(Succeed())
		stderr, err := run(ctx, nil, "-out", filepath.Join(dir, "out"), "-work", dir)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("work directory"))
		Expect(stderr).To(ContainSubstring("file exists"))
		Expect(os.ReadFile(precious)).To(BeEquivalentTo("not the demo's"))
	}, SpecTimeout(time.Minute))
})
