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

package objectstore

import (
	"io"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

var _ = DescribeTable("planParts keeps the part buffers within the budget whatever the object's size",
	func(size int64, want PartPlan) {
		plan, err := planParts(size, DefaultPartSize, DefaultPartSize*DefaultPartConcurrency, DefaultPartConcurrency)
		Expect(err).NotTo(HaveOccurred())
		Expect(plan).To(Equal(want))
		Expect(int64(plan.Buffered) * plan.PartSize).To(BeNumerically("<=", DefaultPartSize*DefaultPartConcurrency))
		if size > 0 {
			Expect((size + plan.PartSize - 1) / plan.PartSize).To(BeNumerically("<=", maxParts))
		}
	},
	Entry("a 4 GiB disk: default parts, all buffers", 4*gib, PartPlan{PartSize: 8 * mib, Buffered: 2}),
	Entry("the largest object of default parts", 8*mib*maxParts, PartPlan{PartSize: 8 * mib, Buffered: 2}),
	Entry("100 GiB: larger parts, fewer of them buffered", 100*gib, PartPlan{PartSize: 11 * mib, Buffered: 1}),
	Entry("1 TiB: parts larger than the budget stream unbuffered", 1024*gib, PartPlan{PartSize: 105 * mib, Buffered: 0}),
	Entry("an unknown size: default parts, buffered", int64(-1), PartPlan{PartSize: 8 * mib, Buffered: 2}),
)

var _ = Describe("planParts", func() {
	It("refuses an object larger than 10,000 parts of 5 GiB", func() {
		_, err := planParts(60<<40, DefaultPartSize, 16*mib, 2)
		Expect(err).To(MatchError(ContainSubstring("more than S3 accepts")))
	})

	It("buffers an object of unknown size even when its parts exceed the budget", func() {
		Expect(planParts(-1, 32*mib, 16*mib, 2)).To(Equal(PartPlan{PartSize: 32 * mib, Buffered: 1}))
	})
})

var _ = Describe("the part buffer pool", func() {
	It("never holds more than its budget, lent or idle, and reuses its buffers", func() {
		pool := newBufferPool(3 * mib)
		var (
			mu   sync.Mutex
			seen = map[*byte]bool{}
			wg   sync.WaitGroup
		)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := 0; i < 50; i++ {
					b := pool.get(int(mib))
					b[0], b[len(b)-1] = 1, 2 // writable, whole
					mu.Lock()
					seen[&b[0]] = true
					mu.Unlock()
					Expect(pool.allocated()).To(BeNumerically("<=", 3*mib))
					pool.put(b)
				}
			}()
		}
		wg.Wait()
		Expect(len(seen)).To(BeNumerically("<=", 3), "400 loans from at most 3 buffers")
	})

	It("drops its idle buffers for buffers of another size", func() {
		pool := newBufferPool(4 * mib)
		a, b := pool.get(int(mib)), pool.get(int(mib))
		pool.put(a)
		pool.put(b)
		Expect(pool.allocated()).To(Equal(2 * mib))
		big := pool.get(int(3 * mib))
		Expect(big).To(HaveLen(int(3 * mib)))
		Expect(pool.allocated()).To(Equal(3*mib), "the two idle 1 MiB buffers are gone")
		pool.put(big)
	})

	It("lends one buffer larger than the budget when it holds nothing else", func() {
		pool := newBufferPool(mib)
		b := pool.get(int(2 * mib))
		Expect(b).To(HaveLen(int(2 * mib)))
		pool.put(b)
	})
})

var _ = Describe("a part's body", func() {
	It("reads and seeks like its buffer, and no longer touches it once detached", func() {
		r := &partReader{b: []byte("0123456789")}
		got, err := io.ReadAll(r)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(got)).To(Equal("0123456789"))
		Expect(r.Seek(4, io.SeekStart)).To(BeNumerically("==", 4))
		buf := make([]byte, 3)
		Expect(r.Read(buf)).To(Equal(3))
		Expect(string(buf)).To(Equal("456"))
		Expect(r.Seek(-2, io.SeekEnd)).To(BeNumerically("==", 8))
		_, err = r.Seek(-1, io.SeekStart)
		Expect(err).To(HaveOccurred())

		r.detach()
		Expect(r.Seek(0, io.SeekStart)).To(BeNumerically("==", 0))
		_, err = r.Read(buf)
		Expect(err).To(MatchError(errDetached))
	})
})
