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

package qcow2meta_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

// qemuMap is what `qemu-img map` says the image itself (depth 0) holds, as
// extents: data where it is, zeroes at host 0.
func qemuMap(path string) []qcow2meta.Extent {
	GinkgoHelper()
	var entries []struct {
		Start, Length, Offset int64
		Depth                 int
		Data, Zero            bool
	}
	Expect(json.Unmarshal(run("qemu-img", "map", "--output=json", "-f", "qcow2", path), &entries)).To(Succeed())
	var out []qcow2meta.Extent
	for _, e := range entries {
		if e.Depth != 0 || !e.Data && !e.Zero {
			continue
		}
		x := qcow2meta.Extent{Guest: e.Start, Length: e.Length}
		if e.Data {
			x.Host = e.Offset
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.Guest+last.Length == x.Guest && (last.Zero() && x.Zero() || !last.Zero() && !x.Zero() && last.Host+last.Length == x.Host) {
				last.Length += x.Length
				continue
			}
		}
		out = append(out, x)
	}
	return out
}

func dataOnly(extents []qcow2meta.Extent) []qcow2meta.Extent {
	var out []qcow2meta.Extent
	for _, e := range extents {
		if !e.Zero() {
			out = append(out, e)
		}
	}
	return out
}

func readMap(path string, maxExtents int) (*qcow2meta.Map, error) {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer f.Close()
	st, err := f.Stat()
	Expect(err).ToNot(HaveOccurred())
	return qcow2meta.ReadMap(context.Background(), f, st.Size(), maxExtents)
}

// l2EntryOffset is where the L2 entry of guest cluster n of the first L1
// entry lies.
func l2EntryOffset(path string, n int64) int64 {
	GinkgoHelper()
	l1 := readUint64(path, 40)
	l2 := readUint64(path, int64(l1)) & 0x00fffffffffffe00
	Expect(l2).ToNot(BeZero())
	return int64(l2) + 8*n
}

var _ = Describe("ReadMap", func() {
	var dir, backing, path string

	BeforeEach(func() {
		dir = GinkgoT().TempDir()
		backing = filepath.Join(dir, "golden.raw")
		Expect(os.WriteFile(backing, nil, 0o644)).To(Succeed())
		Expect(os.Truncate(backing, 100*mib)).To(Succeed())
		path = filepath.Join(dir, "layer.qcow2")
	})

	create := func(size, opts string, withBacking bool, ioCommands ...string) {
		GinkgoHelper()
		args := []string{"create", "-q", "-f", "qcow2"}
		if withBacking {
			args = append(args, "-b", backing, "-F", "raw")
		}
		if opts != "" {
			args = append(args, "-o", opts)
		}
		run("qemu-img", append(args, path, size)...)
		for _, c := range ioCommands {
			run("qemu-io", "-f", "qcow2", "-c", c, path)
		}
	}

	DescribeTable("maps what qemu-img map finds in the image itself",
		func(size, opts string, withBacking bool, ioCommands ...string) {
			create(size, opts, withBacking, ioCommands...)
			m, err := readMap(path, 1<<20)
			Expect(err).ToNot(HaveOccurred())
			want := qemuMap(path)
			if !withBacking {
				// qemu-img map says what has no backing reads as
				// zeroes; ReadMap leaves it out.
				Expect(dataOnly(m.Extents)).To(Equal(dataOnly(want)))
				return
			}
			Expect(m.Extents).To(Equal(want))
		},
		Entry("nothing written", "100M", "", true),
		Entry("plain writes over a backing file", "100M", "", true, "write -P 0xa5 0 1M", "write -P 0x5a 50M 64k", "write 99M 1M", "write 3M 4k"),
		Entry("zeroes and discards over a backing file", "100M", "", true, "write 0 2M", "write -z 512k 512k", "discard 1M 512k", "write -z 40M 1M"),
		Entry("zeroes that keep their clusters", "100M", "", true, "write 0 2M", "write -z 512k 512k"),
		Entry("a base image", "100M", "", false, "write 0 1M", "write -z 2M 1M", "write 60M 3M"),
		Entry("a size that is no multiple of the cluster size", "1049088", "", false, "write -P 0x11 1M 512", "write 0 4k"),
		Entry("small clusters over many L2 tables", "8M", "cluster_size=512", true, "write 0 64k", "write 3M 1k", "write -z 7M 4k"),
		Entry("version 2", "100M", "compat=0.10", true, "write 0 1M", "write 10M 64k"),
		Entry("preallocated metadata", "16M", "preallocation=metadata", false, "write 0 1M"),
	)

	It("takes the virtual size and the backing file from the header", func() {
		create("100M", "", true, "write 0 64k")
		m, err := readMap(path, 16)
		Expect(err).ToNot(HaveOccurred())
		Expect(m.Header.Size).To(Equal(uint64(100 * mib)))
		Expect(m.Header.BackingFile).To(Equal(backing))
	})

	It("fails with ErrTooManyExtents past its cap", func() {
		create("100M", "", true, "write 0 64k", "write 1M 64k", "write 2M 64k")
		_, err := readMap(path, 3)
		Expect(err).To(MatchError(qcow2meta.ErrTooManyExtents))
		_, err = readMap(path, 4)
		Expect(err).ToNot(HaveOccurred())
	})

	DescribeTable("refuses what it does not map",
		func(opts string, ioCommands []string, damage func(path string), message string) {
			create("100M", strings.ReplaceAll(opts, "DIR", dir), true, ioCommands...)
			if damage != nil {
				damage(path)
			}
			_, err := readMap(path, 1<<20)
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("compressed clusters", "", []string{"write -c 0 64k"}, nil, "compressed clusters are not supported"),
		Entry("extended L2 entries", "extended_l2=on,cluster_size=128k", []string{"write 0 4k"}, nil, "extended L2"),
		Entry("an external data file", "data_file=DIR/data.raw", []string{"write 0 4k"}, nil, "external data file"),
		Entry("internal snapshots", "", []string{"write 0 4k"}, func(path string) {
			run("qemu-img", "snapshot", "-c", "s1", path)
		}, "internal snapshots"),
		Entry("the corrupt bit", "", []string{"write 0 4k"}, func(path string) {
			writeUint64(path, 72, readUint64(path, 72)|2)
		}, "marked the image corrupt"),
		Entry("data past the end of the file", "", []string{"write 0 4k"}, func(path string) {
			writeUint64(path, l2EntryOffset(path, 0), 1<<63|1<<40)
		}, "lies past the end of the image"),
		Entry("data not cluster aligned", "", []string{"write 0 4k"}, func(path string) {
			writeUint64(path, l2EntryOffset(path, 0), readUint64(path, l2EntryOffset(path, 0))+512)
		}, "not cluster aligned"),
		Entry("two guest clusters on one host cluster", "", []string{"write 0 64k", "write 1M 64k"}, func(path string) {
			writeUint64(path, l2EntryOffset(path, 16), readUint64(path, l2EntryOffset(path, 0)))
		}, "host clusters used twice"),
		Entry("data on the L1 table", "", []string{"write 0 64k"}, func(path string) {
			writeUint64(path, l2EntryOffset(path, 0), 1<<63|readUint64(path, 40))
		}, "host clusters used twice"),
		Entry("data on an L2 table", "", []string{"write 0 64k"}, func(path string) {
			writeUint64(path, l2EntryOffset(path, 0), readUint64(path, int64(readUint64(path, 40))))
		}, "host clusters used twice"),
	)
})
