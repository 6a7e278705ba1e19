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

package patchcycle_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

const (
	rootCmd     = "pkg/virtctl/root.go"
	upstreamMsg = "controls virtual machine related operations"
	probeMsg    = "controls virtual machines (patch cycle probe)"
)

// The cycle runs on its own tree, patch directory and output directory, so
// it never disturbs the project's real series or build.
var _ = Describe("hack/kubevirt.sh", Ordered, func() {
	var tree, patches, out string

	run := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "kubevirt.sh"), args...)
		cmd.Env = append(os.Environ(), "KUBEVIRT_TREE="+tree, "KUBEVIRT_PATCHES="+patches, "KUBEVIRT_OUT="+out)
		var output bytes.Buffer
		cmd.Stdout, cmd.Stderr = &output, &output
		err := cmd.Run()
		return output.String(), err
	}
	git := func(args ...string) string {
		GinkgoHelper()
		cmd := exec.Command("git", append([]string{"-C", tree, "-c", "user.name=probe", "-c", "user.email=probe@example.invalid"}, args...)...)
		output, err := cmd.CombinedOutput()
		Expect(err).ToNot(HaveOccurred(), string(output))
		return strings.TrimSpace(string(output))
	}
	readPatches := func() map[string][]byte {
		GinkgoHelper()
		files := map[string][]byte{}
		entries, err := os.ReadDir(patches)
		Expect(err).ToNot(HaveOccurred())
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(patches, e.Name()))
			Expect(err).ToNot(HaveOccurred())
			files[e.Name()] = data
		}
		return files
	}

	BeforeAll(func() {
		dir := GinkgoT().TempDir()
		tree, patches, out = filepath.Join(dir, "kubevirt"), filepath.Join(dir, "patches"), filepath.Join(dir, "out")
	})

	It("assembles a pristine tree with api and client-go in staging", func() {
		output, err := run("assemble")
		Expect(err).ToNot(HaveOccurred(), output)
		Expect(git("rev-parse", "pristine")).To(Equal(git("rev-parse", "HEAD")))
		Expect(filepath.Join(tree, "staging/src/kubevirt.io/api/core/v1/types.go")).To(BeARegularFile())
		Expect(filepath.Join(tree, "staging/src/kubevirt.io/client-go/go.mod")).To(BeARegularFile())
		Expect(git("status", "--porcelain")).To(BeEmpty())
	})

	var firstExport map[string][]byte

	It("exports a commit of the tree as a patch and a series", func() {
		root := filepath.Join(tree, rootCmd)
		src, err := os.ReadFile(root)
		Expect(err).ToNot(HaveOccurred())
		Expect(string(src)).To(ContainSubstring(upstreamMsg))
		Expect(os.WriteFile(root, []byte(strings.Replace(string(src), upstreamMsg, probeMsg, 1)), 0o644)).To(Succeed())
		git("commit", "-q", "-a", "-m", "virtctl: probe the patch cycle")

		output, err := run("export")
		Expect(err).ToNot(HaveOccurred(), output)
		firstExport = readPatches()
		Expect(firstExport).To(HaveKey("0001-virtctl-probe-the-patch-cycle.patch"))
		Expect(string(firstExport["series"])).To(ContainSubstring("\n0001-virtctl-probe-the-patch-cycle.patch\n"))
	})

	It("re-applies the series onto the baseline and builds from it", func() {
		git("reset", "-q", "--hard", "pristine")
		output, err := run("apply")
		Expect(err).ToNot(HaveOccurred(), output)
		Expect(git("log", "--format=%s", "pristine..HEAD")).To(Equal("virtctl: probe the patch cycle"))

		output, err = run("build", "virtctl")
		Expect(err).ToNot(HaveOccurred(), output)
		help, err := exec.Command(filepath.Join(out, "bin", "virtctl"), "--help").CombinedOutput()
		Expect(err).ToNot(HaveOccurred(), string(help))
		Expect(string(help)).To(ContainSubstring(probeMsg))
	})

	It("exports the re-applied tree byte for byte as before", func() {
		output, err := run("export")
		Expect(err).ToNot(HaveOccurred(), output)
		Expect(readPatches()).To(Equal(firstExport))
	})

	It("stops at a patch that does not apply, naming it and leaving the tree for inspection", func() {
		broken := bytes.Replace(firstExport["0001-virtctl-probe-the-patch-cycle.patch"], []byte(upstreamMsg), []byte("text that is not there"), 1)
		Expect(os.WriteFile(filepath.Join(patches, "0002-broken.patch"), broken, 0o644)).To(Succeed())
		series := append(firstExport["series"], []byte("0002-broken.patch\n")...)
		Expect(os.WriteFile(filepath.Join(patches, "series"), series, 0o644)).To(Succeed())

		output, err := run("apply")
		Expect(err).To(HaveOccurred())
		Expect(output).To(ContainSubstring("patch 0002-broken.patch does not apply"))
		Expect(output).To(ContainSubstring(rootCmd))
		Expect(filepath.Join(tree, ".git", "rebase-apply")).To(BeADirectory())
	})
})
