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

package testenv_test

import (
	"encoding/binary"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

var _ = Describe("ReadMountInfo", func() {
	It("parses propagation tags and unescapes blanks", func() {
		path := filepath.Join(GinkgoT().TempDir(), "mountinfo")
		Expect(os.WriteFile(path, []byte(
			"27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"+
				`90 27 254:0 /tmp/a\040b /mnt/x\040y rw,relatime master:7 - ext4 /dev/vda rw`+"\n"), 0o644)).To(Succeed())
		mounts, err := testenv.ReadMountInfo(path)
		Expect(err).NotTo(HaveOccurred())
		Expect(mounts).To(Equal([]testenv.Mount{
			{ID: 27, ParentID: 1, Root: "/", MountPoint: "/", Options: "rw,relatime", Optional: []string{"shared:1"}, FSType: "ext4", Source: "/dev/vda"},
			{ID: 90, ParentID: 27, Root: "/tmp/a b", MountPoint: "/mnt/x y", Options: "rw,relatime", Optional: []string{"master:7"}, FSType: "ext4", Source: "/dev/vda"},
		}))
	})

	It("refuses a line without the separator", func() {
		path := filepath.Join(GinkgoT().TempDir(), "mountinfo")
		Expect(os.WriteFile(path, []byte("27 1 254:0 / / rw ext4 /dev/vda rw\n"), 0o644)).To(Succeed())
		_, err := testenv.ReadMountInfo(path)
		Expect(err).To(MatchError(ContainSubstring("malformed mountinfo line")))
	})
})

var _ = Describe("the test guest's pattern", func() {
	It("puts the LBA and seed first and varies the fill with both", func() {
		s := testenv.GuestSector(0x1_0000_0005, 7)
		Expect(s).To(HaveLen(testenv.SectorSize))
		Expect(binary.LittleEndian.Uint64(s)).To(BeEquivalentTo(0x1_0000_0005))
		Expect(binary.LittleEndian.Uint32(s[8:])).To(BeEquivalentTo(7))
		Expect(s[12:]).NotTo(Equal(testenv.GuestSector(0x1_0000_0006, 7)[12:]))
		Expect(s[12:]).NotTo(Equal(testenv.GuestSector(0x1_0000_0005, 8)[12:]))
	})

	It("names the first sector that differs", func() {
		data := append(testenv.GuestSector(3, 1), testenv.GuestSector(5, 1)...)
		Expect(testenv.VerifyGuestData(data[:testenv.SectorSize], 3, 1)).To(Succeed())
		Expect(testenv.VerifyGuestData(data, 3, 1)).To(MatchError(ContainSubstring("sector 4 ")))
	})

	It("refuses parameters that would overwrite the guest", func(ctx SpecContext) {
		_, err := testenv.GuestParams{StartLBA: 0, Sectors: 1}.BootSector(ctx)
		Expect(err).To(MatchError(ContainSubstring("at least 1")))
		_, err = testenv.GuestParams{StartLBA: 1, SectorsPerCall: 128}.BootSector(ctx)
		Expect(err).To(MatchError(ContainSubstring("exceeds 127")))
	})
})

var _ = Describe("ParseGuestStatus", func() {
	DescribeTable("reads the guest's serial lines",
		func(serial string, want testenv.GuestStatus) {
			Expect(testenv.ParseGuestStatus(serial)).To(Equal(want))
		},
		Entry("nothing yet", "", testenv.GuestStatus{}),
		Entry("started", "START 00000001 00000800 0000abcd\r\n", testenv.GuestStatus{Started: true}),
		Entry("progress", "START 00000001 00000800 0000abcd\r\nPROGRESS 000001fc\r\nPROGRESS 000003f8\r\n",
			testenv.GuestStatus{Started: true, Written: 0x3f8}),
		Entry("done", "START 00000001 00000800 0000abcd\r\nDONE 00000800\r\n",
			testenv.GuestStatus{Started: true, Written: 0x800, Done: true}),
		Entry("failed", "START 00000001 00000800 0000abcd\r\nPROGRESS 000001fc\r\nERR 01\r\n",
			testenv.GuestStatus{Started: true, Written: 0x1fc, Failed: true, Err: 1}),
	)
})

var _ = DescribeTable("WholeLines keeps what a reader of a log being written may parse",
	func(serial string, want testenv.GuestStatus) {
		Expect(testenv.ParseGuestStatus(testenv.WholeLines(serial))).To(Equal(want))
	},
	Entry("DONE written, its count not yet", "START 00000001 00000800 0000abcd\r\nPROGRESS 000001fc\r\nDONE",
		testenv.GuestStatus{Started: true, Written: 0x1fc}),
	Entry("DONE and part of its count", "START 00000001 00000800 0000abcd\r\nPROGRESS 000001fc\r\nDONE 0000",
		testenv.GuestStatus{Started: true, Written: 0x1fc}),
	Entry("DONE and its count, the line's end not yet", "START 00000001 00000800 0000abcd\r\nDONE 00000800",
		testenv.GuestStatus{Started: true}),
	Entry("the whole DONE line", "START 00000001 00000800 0000abcd\r\nDONE 00000800\r\n",
		testenv.GuestStatus{Started: true, Written: 0x800, Done: true}),
)

var _ = DescribeTable("ParseLinuxGuest keeps what the Linux test guest said in its last boot",
	func(serial string, want testenv.LinuxGuestStatus) {
		Expect(testenv.ParseLinuxGuest(serial)).To(Equal(want))
	},
	Entry("a first boot writing two pieces",
		"SYSLINUX 6.04\r\nKQG BOOT 1\r\nKQG GOLDEN OK\r\nKQG VERIFIED 0/0\r\nKQG PUBLISHED 1 aa\r\nKQG PUBLISHED 2 bb\r\nKQG DONE\r\n",
		testenv.LinuxGuestStatus{Boot: 1, Golden: "OK", Published: map[int]string{1: "aa", 2: "bb"}, Trimmed: -1, Done: true}),
	Entry("a second boot, one piece lost, the first boot's lines left out",
		"KQG BOOT 1\r\nKQG PUBLISHED 1 aa\r\nKQG BOOT 2\r\nKQG GOLDEN OK\r\nKQG BAD 1\r\nKQG VERIFIED 1/2\r\nKQG TRIMMED 4096\r\nKQG FULL\r\n",
		testenv.LinuxGuestStatus{Boot: 2, Golden: "OK", Verified: 1, Listed: 2, Bad: []int{1}, Published: map[int]string{}, Trimmed: 4096, Full: true}),
	Entry("writes to disks plugged in later, one refused",
		"KQG BOOT 1\r\nKQG DONE\r\nKQG IDLE\r\nKQG WROTE sda FAILED\r\nKQG IDLE\r\nKQG WROTE sda 1048576 cc\r\nKQG IDLE\r\n",
		testenv.LinuxGuestStatus{Boot: 1, Published: map[int]string{}, Trimmed: -1, Done: true, Writes: []testenv.DiskWrite{
			{Device: "sda", Failed: true}, {Device: "sda", Bytes: 1 << 20, SHA256: "cc"}}}),
	Entry("what a plugged-in disk holds read back as other disks come",
		"KQG BOOT 1\r\nKQG DONE\r\nKQG IDLE\r\nKQG WROTE sda 1048576 cc\r\nKQG IDLE\r\nKQG READ sda OK\r\nKQG IDLE\r\nKQG READ sda BAD\r\n",
		testenv.LinuxGuestStatus{Boot: 1, Published: map[int]string{}, Trimmed: -1, Done: true,
			Writes: []testenv.DiskWrite{{Device: "sda", Bytes: 1 << 20, SHA256: "cc"}},
			Reads:  []testenv.DiskRead{{Device: "sda", OK: true}, {Device: "sda", OK: false}}}),
	Entry("an error, which makes the status inconsistent",
		"KQG BOOT 1\r\nKQG GOLDEN OK\r\nKQG VERIFIED 0/0\r\nKQG ERROR cannot make / read-only\r\nKQG DONE\r\n",
		testenv.LinuxGuestStatus{Boot: 1, Golden: "OK", Published: map[int]string{}, Trimmed: -1, Done: true,
			Errors: []string{"cannot make / read-only"}}),
)

var _ = It("a Linux test guest that met an error is not consistent", func() {
	Expect(testenv.ParseLinuxGuest("KQG BOOT 1\nKQG GOLDEN OK\nKQG VERIFIED 0/0\nKQG DONE\n").Consistent()).To(BeTrue())
	Expect(testenv.ParseLinuxGuest("KQG BOOT 1\nKQG GOLDEN OK\nKQG VERIFIED 0/0\nKQG ERROR x\nKQG DONE\n").Consistent()).To(BeFalse())
})

var _ = Describe("the commands of a document", func() {
	const doc = "# Title\n\n```sh\nmake\n```\n\n## Install\n\nText.\n\n```sh\nkubectl apply -k deploy/kubevirt   # the images first\n```\n\n" +
		"### Gates\n\n```sh\nkubectl patch kubevirt kubevirt\nkubectl apply -k deploy/kubevirt-hook\n```\n\n```yaml\nkind: KubeVirt\n```\n\n## Roll back\n\n```sh\nkubectl apply -k deploy/kubevirt/rollback\n```\n"
	var file string
	BeforeEach(func() {
		file = filepath.Join(GinkgoT().TempDir(), "doc.md")
		Expect(os.WriteFile(file, []byte(doc), 0o644)).To(Succeed())
	})

	It("are the shell blocks of a section and its subsections, up to the next heading of its level", func() {
		Expect(testenv.DocShellBlocks(file, "## Install")).To(Equal([]string{
			"kubectl apply -k deploy/kubevirt   # the images first\n", "kubectl patch kubevirt kubevirt\nkubectl apply -k deploy/kubevirt-hook\n"}))
		Expect(testenv.DocShellBlocks(file, "### Gates")).To(Equal([]string{"kubectl patch kubevirt kubevirt\nkubectl apply -k deploy/kubevirt-hook\n"}))
		Expect(testenv.DocShellBlocks(file, "# Title")).To(HaveLen(4))
		_, err := testenv.DocShellBlocks(file, "## Upgrade")
		Expect(err).To(MatchError(ContainSubstring(`no section "## Upgrade"`)))
	})

	It("give one command line by what it contains, without its comment", func() {
		Expect(testenv.DocCommand(file, "## Install", "-k deploy/kubevirt")).To(Equal([]string{"kubectl", "apply", "-k", "deploy/kubevirt"}))
		Expect(testenv.DocCommand(file, "## Install", "-k deploy/kubevirt-hook")).To(Equal([]string{"kubectl", "apply", "-k", "deploy/kubevirt-hook"}))
		_, err := testenv.DocCommand(file, "## Install", "apply")
		Expect(err).To(MatchError(ContainSubstring("2 command lines")))
		_, err = testenv.DocCommand(file, "# Title", "kubectl")
		Expect(err).To(MatchError(ContainSubstring("4 command lines")))
	})
})
