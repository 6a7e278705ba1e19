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

package qcow2meta

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Check's reference counters", func() {
	It("refuse an image whose references need more counters than the limit", func() {
		dir := GinkgoT().TempDir()
		path := filepath.Join(dir, "overlay.qcow2")
		// 3 MiB of 512-byte clusters: past the first chunk of counters.
		for _, args := range [][]string{
			{"qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=512", path, "64M"},
			{"qemu-io", "-f", "qcow2", "-c", "write 0 3M", path},
		} {
			out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
			Expect(err).ToNot(HaveOccurred(), string(out))
		}
		f, err := os.Open(path)
		Expect(err).ToNot(HaveOccurred())
		defer f.Close()
		fi, err := f.Stat()
		Expect(err).ToNot(HaveOccurred())

		c, err := newChecker(context.Background(), f, fi.Size())
		Expect(err).ToNot(HaveOccurred())
		c.refs.limit = 1
		err = c.run()
		Expect(err).To(MatchError(errTooLarge))
		Expect(err).To(MatchError("image too large to check: its references need more than 4096 counters"))

		c, err = newChecker(context.Background(), f, fi.Size())
		Expect(err).ToNot(HaveOccurred())
		c.refs.limit = 2
		Expect(c.run()).To(Succeed())
		Expect(c.res.Clean()).To(BeTrue(), c.res.String())
	})
})
