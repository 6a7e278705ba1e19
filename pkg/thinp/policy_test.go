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

package thinp_test

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

var _ = Describe("Policy", func() {
	It("defaults to 1 GiB chunks, half a chunk of free space and a 2 s poll", func() {
		p := thinp.Policy{}.WithDefaults()
		Expect(p.ChunkSize).To(Equal(gib))
		Expect(p.FreeThreshold).To(Equal(gib / 2))
		Expect(p.PollInterval).To(Equal(2 * time.Second))
		Expect(p.Resume).To(Equal(thinp.AutoResume))
	})

	DescribeTable("Validate",
		func(p thinp.Policy, message string) {
			err := p.Validate()
			if message == "" {
				Expect(err).ToNot(HaveOccurred())
				return
			}
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("default", thinp.Policy{}, ""),
		Entry("small chunk with a threshold below it", thinp.Policy{ChunkSize: 8 * mib, FreeThreshold: 4 * mib}, ""),
		Entry("chunk below a MiB", thinp.Policy{ChunkSize: 4096}, "chunk size 4096 is below the minimum"),
		Entry("threshold as large as the chunk", thinp.Policy{ChunkSize: 64 * mib, FreeThreshold: 64 * mib}, "is not below the chunk size"),
		Entry("negative threshold", thinp.Policy{FreeThreshold: -1}, "is negative"),
		Entry("unknown resume behavior", thinp.Policy{Resume: 7}, "unknown resume behavior 7"),
	)

	DescribeTable("NextSize",
		func(u thinp.Usage, maximum, want int64) {
			Expect(thinp.Policy{ChunkSize: 256 * mib}.NextSize(u, maximum)).To(Equal(want))
		},
		Entry("one chunk above the device", thinp.Usage{Allocation: 900 * mib, Physical: gib}, 10*gib, gib+256*mib),
		Entry("rounded up to a MiB", thinp.Usage{Allocation: 10, Physical: gib + 1}, 10*gib, gib+257*mib),
		Entry("capped at the maximum", thinp.Usage{Allocation: gib, Physical: gib}, gib+100*mib, gib+100*mib),
		Entry("never below the device", thinp.Usage{Allocation: gib, Physical: 2 * gib}, gib, 2*gib),
	)

	DescribeTable("Threshold and NeedsExtension",
		func(u thinp.Usage, threshold uint64, needs bool) {
			p := thinp.Policy{ChunkSize: 256 * mib, FreeThreshold: 128 * mib}
			Expect(p.Threshold(u.Physical)).To(Equal(threshold))
			Expect(p.NeedsExtension(u, 10*gib)).To(Equal(needs))
		},
		Entry("plenty of room", thinp.Usage{Allocation: 100 * mib, Physical: gib}, uint64(896*mib), false),
		Entry("exactly the threshold left", thinp.Usage{Allocation: 896 * mib, Physical: gib}, uint64(896*mib), false),
		Entry("less than the threshold left", thinp.Usage{Allocation: 897 * mib, Physical: gib}, uint64(896*mib), true),
		Entry("device smaller than the threshold", thinp.Usage{Allocation: 0, Physical: 64 * mib}, uint64(0), true),
		Entry("at the maximum", thinp.Usage{Allocation: 10 * gib, Physical: 10 * gib}, uint64(10*gib-128*mib), false),
	)

	DescribeTable("CheckAllocation",
		func(u thinp.Usage, reason string) {
			err := thinp.CheckAllocation(u, 2*gib)
			if reason == "" {
				Expect(err).ToNot(HaveOccurred())
				return
			}
			var improbable *thinp.ImprobableAllocationError
			Expect(errors.As(err, &improbable)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring(reason)))
		},
		Entry("a full device", thinp.Usage{Allocation: gib, Physical: gib}, ""),
		Entry("past the end of the device, as a write that failed with ENOSPC leaves it", thinp.Usage{Allocation: gib + 18944, Physical: gib}, ""),
		Entry("past the fully allocated image", thinp.Usage{Allocation: 3 * gib, Physical: 4 * gib}, "beyond the fully allocated image size"),
		Entry("negative", thinp.Usage{Allocation: -1, Physical: gib}, "negative size"),
	)

	Describe("MaximumSize", func() {
		It("is the fully allocated image as qemu-img measures it, rounded up to a MiB", func() {
			var args []string
			tool := qcow2.Tool{Exec: func(_ context.Context, a ...string) ([]byte, error) {
				args = a
				return []byte(`{"required": 1, "fully-allocated": 10739318784}`), nil
			}}
			size, err := thinp.MaximumSize(context.Background(), tool, 10*gib, qcow2.CreateOptions{ClusterSize: 65536})
			Expect(err).ToNot(HaveOccurred())
			Expect(size).To(Equal(10242 * mib))
			Expect(args).To(Equal([]string{"measure", "--output=json", "-O", "qcow2", "-o", "cluster_size=65536", "--size", "10737418240"}))
		})

		It("runs the real qemu-img: metadata makes the maximum exceed the virtual size", func() {
			size, err := thinp.MaximumSize(context.Background(), qcow2.Tool{}, 50*gib, qcow2.CreateOptions{})
			Expect(err).ToNot(HaveOccurred())
			Expect(size).To(BeNumerically(">", 50*gib))
			Expect(size).To(BeNumerically("<", 50*gib+64*mib))
		})

		It("refuses a non-positive virtual size", func() {
			_, err := thinp.MaximumSize(context.Background(), qcow2.Tool{}, 0, qcow2.CreateOptions{})
			Expect(err).To(MatchError(ContainSubstring("virtual size must be positive")))
		})
	})
})

var _ = DescribeTable("CanTransition",
	func(from, to thinp.State, ok bool) {
		Expect(thinp.CanTransition(from, to)).To(Equal(ok))
	},
	Entry("arm", thinp.StateUnarmed, thinp.StateArmed, true),
	Entry("threshold crossed", thinp.StateArmed, thinp.StateExceeded, true),
	Entry("extension starts", thinp.StateExceeded, thinp.StateExtending, true),
	Entry("extension done", thinp.StateExtending, thinp.StateUnarmed, true),
	Entry("extension failed", thinp.StateExtending, thinp.StateExceeded, true),
	Entry("reached the maximum", thinp.StateExtending, thinp.StateAtMaximum, true),
	Entry("no extension without crossing", thinp.StateArmed, thinp.StateExtending, false),
	Entry("extended disks are re-armed, not armed", thinp.StateExtending, thinp.StateArmed, false),
	Entry("the maximum is final", thinp.StateAtMaximum, thinp.StateArmed, false),
)
