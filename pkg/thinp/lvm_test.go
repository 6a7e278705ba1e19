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
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

// fakeLVM answers lvs with a size and records every command.
type fakeLVM struct {
	size     int64
	extent   int64
	commands []string
	fail     string
}

func (f *fakeLVM) exec(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	f.commands = append(f.commands, cmd)
	if f.fail != "" && name == f.fail {
		return nil, errors.New("exit status 5: Insufficient free space")
	}
	switch name {
	case "lvs":
		return []byte(fmt.Sprintf("  %d\n", f.size)), nil
	case "lvextend":
		var want int64
		_, err := fmt.Sscanf(args[3], "%db", &want)
		Expect(err).ToNot(HaveOccurred())
		f.size = (want + f.extent - 1) / f.extent * f.extent
	}
	return nil, nil
}

var _ = Describe("LVMExtender", func() {
	var (
		lvm *fakeLVM
		ext *thinp.LVMExtender
	)
	BeforeEach(func() {
		lvm = &fakeLVM{size: gib, extent: 4 * mib}
		ext = &thinp.LVMExtender{VolumeGroup: "vg0", LogicalVolume: "disk1", Exec: lvm.exec}
	})

	It("extends to the size, refreshes the volume and reports the size LVM rounded to", func() {
		size, err := ext.Extend(context.Background(), 2*gib+mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(Equal(2*gib + 4*mib))
		Expect(lvm.commands).To(Equal([]string{
			"lvs --noheadings --nosuffix --units b -o lv_size vg0/disk1",
			"lvextend --autobackup n --size 2148532224b vg0/disk1",
			"lvchange --refresh vg0/disk1",
			"lvs --noheadings --nosuffix --units b -o lv_size vg0/disk1",
		}))
	})

	It("only refreshes a volume that is large enough already", func() {
		size, err := ext.Extend(context.Background(), gib)
		Expect(err).ToNot(HaveOccurred())
		Expect(size).To(Equal(gib))
		Expect(lvm.commands).ToNot(ContainElement(HavePrefix("lvextend")))
		Expect(lvm.commands).To(ContainElement("lvchange --refresh vg0/disk1"))
	})

	DescribeTable("reports which step failed",
		func(failing, message string) {
			lvm.fail = failing
			_, err := ext.Extend(context.Background(), 2*gib)
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("lvs", "lvs", "extend logical volume vg0/disk1: exit status 5"),
		Entry("lvextend", "lvextend", "extend logical volume vg0/disk1 to 2147483648 bytes: exit status 5"),
		Entry("lvchange", "lvchange", "refresh logical volume vg0/disk1: exit status 5"),
	)

	It("runs the real commands when no function is injected", func() {
		ext := &thinp.LVMExtender{VolumeGroup: "thinp-test-no-such-vg", LogicalVolume: "lv"}
		_, err := ext.Extend(context.Background(), gib)
		Expect(err).To(MatchError(ContainSubstring("extend logical volume thinp-test-no-such-vg/lv: lvs --noheadings")))
	})
})
