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

package overlaydemo

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("usageTable", func() {
	It("lines up one row per disk and compares the overlays with full copies", func() {
		table, err := usageTable("after the first boot", []diskUsage{
			{disk: "golden", kind: "backing", format: "raw", virtual: 256 * mib, allocated: 95 * mib},
			{disk: "vm-a", kind: "ephemeral", format: "qcow2", virtual: 256 * mib, allocated: 4*mib + mib/2},
			{disk: "vm-c", kind: "persistent", format: "qcow2", virtual: 256 * mib, allocated: 12 * mib},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(table).To(Equal(`disk usage after the first boot:
    disk    kind        format  virtual size  allocated  allocated bytes
    golden  backing     raw     256 MiB       95.0 MiB   99614720
    vm-a    ephemeral   qcow2   256 MiB       4.5 MiB    4718592
    vm-c    persistent  qcow2   256 MiB       12.0 MiB   12582912
    the 2 overlays together: 16.5 MiB; 2 full copies of the golden image: 190.0 MiB
`))
	})

	DescribeTable("shows a virtual size exactly",
		func(size int64, want string) { Expect(sizeMiB(size)).To(Equal(want)) },
		Entry("whole MiB", int64(256*mib), "256 MiB"),
		Entry("not whole MiB", int64(256*mib+512), "268435968 B"),
	)
})
