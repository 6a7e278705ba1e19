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
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// readmeTrial is the README's section a new user follows on one machine.
const readmeTrial = "## Try it on one machine"

// userImage stands in the README for the user's own image.
const userImage = "/path/to/image.raw"

// lockedBuffer collects a command's output while a spec reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var _ = Describe("the README's trial on one machine", Ordered, Label(linuxGuestLabel, "readme"), func() {
	const exampleNamespace, exampleVM = "qcow2-examples", "overlay-ephemeral"

	cleanUp := func(ctx context.Context) {
		for _, args := range [][]string{
			{"delete", "namespace", exampleNamespace, "--ignore-not-found", "--wait=true", "--timeout=3m"},
			{"delete", "pv", "golden-fedora", "--ignore-not-found", "--wait=true"},
		} {
			Expect(kubectl(ctx, args...)).Error().ToNot(HaveOccurred())
		}
		Expect(inNode(ctx, "rm", "-rf", "/var/lib/golden")).Error().ToNot(HaveOccurred())
	}

	BeforeAll(func(ctx SpecContext) {
		cleanUp(ctx)
		DeferCleanup(cleanUp)
	})

	It("brings the user's Linux image to Running with the commands as written, the guest booting", func(ctx SpecContext) {
		blocks, err := testenv.DocShellBlocks("README.md", readmeTrial)
		Expect(err).ToNot(HaveOccurred())
		Expect(blocks).To(HaveLen(2), "the trial's shell blocks: the cluster, then the VM")
		Expect(blocks[1]).To(ContainSubstring(userImage))
		image, err := testenv.LinuxGuestImage(ctx)
		framework.Require(err, "the Linux test guest (hack/guest-image.sh)")

		// One shell, as the user types: the first block's export holds
		// for the second. The second ends watching the VMI, which only an
		// interrupt ends.
		script := "set -e\n" + blocks[0] + strings.ReplaceAll(blocks[1], userImage, image)
		var out lockedBuffer
		cmd := exec.CommandContext(ctx, "bash", "-c", script)
		cmd.Dir = testenv.RepoRoot()
		cmd.Stdout, cmd.Stderr = &out, &out
		// The watch runs in a child of the shell: end the whole group, or
		// it holds the output open and Wait never returns.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		Expect(cmd.Start()).To(Succeed())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		DeferCleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			if err := <-done; err != nil {
				GinkgoWriter.Printf("the README's commands ended: %v\n", err)
			}
		})

		Eventually(func(g Gomega) {
			select {
			case err := <-done:
				// The watch ends only when killed: any end is early, and
				// waiting on would not change it.
				done <- err
				StopTrying("the README's commands ended early:\n" + out.String()).Wrap(err).Now()
			default:
			}
			g.Expect(out.String()).To(MatchRegexp(`(?m)^`+exampleVM+`\s.*\sRunning\s`), "the watch so far:\n%s", out.String())
		}).WithContext(ctx).WithTimeout(20 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())

		// The user's image boots: the guest reports on its serial console,
		// which the launcher's guest-console-log container shows.
		Eventually(func(g Gomega) {
			pod, err := kubectl(ctx, "-n", exampleNamespace, "get", "pods", "-l", "vm.kubevirt.io/name="+exampleVM,
				"--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].metadata.name}")
			g.Expect(err).ToNot(HaveOccurred())
			serial, err := kubectl(ctx, "-n", exampleNamespace, "logs", pod, "-c", "guest-console-log")
			g.Expect(err).ToNot(HaveOccurred())
			status := testenv.ParseLinuxGuest(testenv.WholeLines(serial))
			g.Expect(status.Done).To(BeTrue(), "guest serial so far: %q", serial)
			g.Expect(status.Golden).To(Equal("OK"))
		}).WithContext(ctx).WithTimeout(linuxTimeout).WithPolling(2 * time.Second).Should(Succeed())
	}, SpecTimeout(30*time.Minute))
})
