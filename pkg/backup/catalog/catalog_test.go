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

package catalog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore/objectstoretest"
)

func file(disk string) []catalog.FileEntry {
	return []catalog.FileEntry{{DiskName: disk, ObjectPath: "x/" + disk, Size: 1}}
}

func cp(id string, t catalog.CheckpointType, parent string) catalog.CheckpointEntry {
	return catalog.CheckpointEntry{ID: id, Type: t, Parent: parent, Files: file("vda"), State: catalog.Complete}
}

var vm = catalog.VM{Namespace: "ns", Name: "vm1"}

var _ = Describe("layout", func() {
	It("puts documents and files where the published design does", func() {
		Expect(catalog.VMIndexPath(vm)).To(Equal("checkpoints/ns/vm1/index.json"))
		Expect(catalog.DiskPath(vm, "cp1", "b1", "vda")).To(Equal("checkpoints/ns/vm1/cp1/b1-vda.qcow2"))
		Expect(catalog.BackupIndexPath("b1")).To(Equal("manifests/b1/index.json"))
		Expect(catalog.VMManifestPath("b1", vm)).To(Equal("manifests/b1/ns-vm1.json"))
		parsed, ok := catalog.ParseVMIndexPath("checkpoints/ns/vm1/index.json")
		Expect(ok).To(BeTrue())
		Expect(parsed).To(Equal(vm))
	})

	DescribeTable("roots the documents in the location's bucket",
		func(prefix, root string) {
			Expect(catalog.Root(prefix)).To(Equal(root))
		},
		Entry("beside a prefix", "velero", "velero-kubevirt-datamover"),
		Entry("beside a nested prefix, slashes trimmed", "/clusters/a/", "clusters/a-kubevirt-datamover"),
		Entry("without a prefix, in Velero's directory for plugins", "", "plugins/kubevirt-datamover"),
	)

	DescribeTable("knows where earlier releases kept them",
		func(prefix, root string) {
			Expect(catalog.LegacyRoot(prefix)).To(Equal(root))
		},
		Entry("under a prefix", "velero", "velero/kubevirt-datamover"),
		Entry("without a prefix", "", "kubevirt-datamover"),
	)
})

var _ = Describe("chain", func() {
	DescribeTable("walks parents to the full base and refuses inconsistent chains",
		func(entries []catalog.CheckpointEntry, tip string, want []string, reason string) {
			idx := &catalog.VMIndex{VMName: "vm1", Namespace: "ns", Checkpoints: entries}
			chain, err := idx.Chain(tip)
			if reason != "" {
				Expect(err).To(MatchError(ContainSubstring(reason)))
				return
			}
			Expect(err).NotTo(HaveOccurred())
			Expect(catalog.IDs(chain)).To(Equal(want))
		},
		Entry("full alone", []catalog.CheckpointEntry{cp("a", catalog.Full, "")}, "a", []string{"a"}, ""),
		Entry("two incrementals", []catalog.CheckpointEntry{
			cp("c", catalog.Incremental, "b"), cp("a", catalog.Full, ""), cp("b", catalog.Incremental, "a"),
		}, "c", []string{"a", "b", "c"}, ""),
		Entry("a missing parent", []catalog.CheckpointEntry{cp("b", catalog.Incremental, "a")}, "b", nil, "parent a is not in the index"),
		Entry("an unknown tip", []catalog.CheckpointEntry{cp("a", catalog.Full, "")}, "z", nil, "not in the index"),
		Entry("a pending parent", []catalog.CheckpointEntry{
			{ID: "a", Type: catalog.Full, Files: file("vda"), State: catalog.Pending}, cp("b", catalog.Incremental, "a"),
		}, "b", nil, "a is pending"),
		Entry("a full with a parent", []catalog.CheckpointEntry{cp("a", catalog.Full, "z"), cp("z", catalog.Full, "")}, "a", nil, "names parent z"),
		Entry("an incremental without one", []catalog.CheckpointEntry{cp("a", catalog.Incremental, "")}, "a", nil, "has no parent"),
		Entry("a loop", []catalog.CheckpointEntry{cp("a", catalog.Incremental, "b"), cp("b", catalog.Incremental, "a")}, "a", nil, "loop"),
		Entry("a layer lacking a disk", []catalog.CheckpointEntry{
			{ID: "a", Type: catalog.Full, Files: append(file("vda"), file("vdb")...)}, cp("b", catalog.Incremental, "a"),
		}, "b", nil, "b lacks disk vdb"),
		Entry("a layer adding a disk", []catalog.CheckpointEntry{
			cp("a", catalog.Full, ""), {ID: "b", Type: catalog.Incremental, Parent: "a", Files: append(file("vda"), file("vdb")...)},
		}, "b", nil, "disk vdb of b is not in base a"),
		Entry("a checkpoint of the published design (no state)", []catalog.CheckpointEntry{
			{ID: "a", Type: catalog.Full, Files: file("vda")},
		}, "a", []string{"a"}, ""),
	)

	It("orders complete checkpoints by sequence, skipping pending ones", func() {
		idx := &catalog.VMIndex{Checkpoints: []catalog.CheckpointEntry{
			{ID: "a", Sequence: 1}, {ID: "c", State: catalog.Pending}, {ID: "b", Sequence: 2, State: catalog.Complete},
		}}
		latest := idx.Latest()
		Expect(latest).To(HaveLen(2))
		Expect(latest[0].ID).To(Equal("b"))
		Expect(idx.NextSequence()).To(BeEquivalentTo(3))
	})
})

var _ = Describe("conditional updates", func() {
	var (
		ctx   context.Context
		store *objectstoretest.Memory
		cat   *catalog.Catalog
	)
	BeforeEach(func() {
		ctx = context.Background()
		store = objectstoretest.NewMemory()
		cat = catalog.New(store)
	})

	It("keeps every writer's change when many update one index at once", func() {
		const writers = 24
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := 0; i < writers; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				defer GinkgoRecover()
				_, err := cat.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
					idx.Checkpoints = append(idx.Checkpoints, cp(fmt.Sprintf("cp%02d", i), catalog.Full, ""))
					return nil
				})
				errs <- err
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			Expect(err).NotTo(HaveOccurred())
		}
		idx, err := cat.VMIndex(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(writers))
		Expect(idx.SchemaVersion).To(Equal(catalog.SchemaVersion))
	})

	It("adds every VM of a backup finishing together to its index", func() {
		var wg sync.WaitGroup
		for i := 0; i < 10; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				defer GinkgoRecover()
				_, err := cat.AddVMToBackup(ctx, "b1", catalog.BackupVM{Namespace: "ns", Name: fmt.Sprintf("vm%d", i), CheckpointID: "c"})
				Expect(err).NotTo(HaveOccurred())
			}(i)
		}
		wg.Wait()
		m, found, err := cat.BackupManifest(ctx, "b1")
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeTrue())
		Expect(m.VMs).To(HaveLen(10))
	})

	It("refuses a document of a newer schema instead of misreading it", func() {
		doc, _ := json.Marshal(map[string]any{"schemaVersion": catalog.SchemaVersion + 1, "vmName": "vm1"})
		_, err := store.Put(ctx, catalog.VMIndexPath(vm), strings.NewReader(string(doc)), int64(len(doc)), objectstore.PutOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, err = cat.VMIndex(ctx, vm)
		Expect(err).To(MatchError(catalog.ErrTooNew))
	})

	It("gives colliding VM names of one backup separate manifests", func() {
		a := catalog.VMBackupManifest{Namespace: "a-b", Name: "c", BackupName: "b1", CheckpointChain: []string{"x"}}
		b := catalog.VMBackupManifest{Namespace: "a", Name: "b-c", BackupName: "b1", CheckpointChain: []string{"y"}}
		pa, err := cat.PutVMManifest(ctx, a)
		Expect(err).NotTo(HaveOccurred())
		pb, err := cat.PutVMManifest(ctx, b)
		Expect(err).NotTo(HaveOccurred())
		Expect(pa).To(Equal("manifests/b1/a-b-c.json"))
		Expect(pb).NotTo(Equal(pa))
		got, err := cat.VMManifest(ctx, pb)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.CheckpointChain).To(Equal([]string{"y"}))
	})
})

var _ = Describe("torn reads", func() {
	var (
		ctx   context.Context
		store *objectstoretest.Memory
		cat   *catalog.Catalog
		key   string
		tears int
	)
	BeforeEach(func() {
		ctx = context.Background()
		store = objectstoretest.NewMemory()
		cat = catalog.New(store)
		key = catalog.VMIndexPath(vm)
		_, err := cat.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
			idx.Checkpoints = append(idx.Checkpoints, cp("a", catalog.Full, ""))
			return nil
		})
		Expect(err).NotTo(HaveOccurred())
		tears = 0
	})

	// tearing tears the next n whole reads with tear.
	tearing := func(n int, tear func([]byte) []byte) {
		store.Tear = func(_ string, data []byte) []byte {
			if tears >= n {
				return data
			}
			tears++
			return tear(data)
		}
	}
	truncate := func(data []byte) []byte { return data[:len(data)/2] }
	// A body of the same length whose bytes differ: only the checksum
	// tells it from the object.
	flip := func(data []byte) []byte { data[len(data)-3] ^= 0x20; return data }

	DescribeTable("reads the document again and decodes only a whole one",
		func(tear func([]byte) []byte) {
			tearing(3, tear)
			idx, err := cat.VMIndex(ctx, vm)
			Expect(err).NotTo(HaveOccurred())
			Expect(tears).To(Equal(3), "every torn read was retried")
			Expect(catalog.IDs(idx.Checkpoints)).To(Equal([]string{"a"}))
		},
		Entry("a body cut short that ends cleanly", truncate),
		Entry("a body of the right length with other bytes", flip),
	)

	// A store that keeps no checksum of its own (older S3 servers) leaves
	// only the SHA-256 the catalog writes with every document.
	It("tells other bytes of the right length from the document on a store that keeps no checksum", func() {
		store.NoChecksums = true
		// Still valid JSON, of the same length: decoded, it would be
		// trusted as an index of checkpoint "b".
		tearing(3, func(data []byte) []byte { return bytes.Replace(data, []byte(`"id": "a"`), []byte(`"id": "b"`), 1) })
		idx, err := cat.VMIndex(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(tears).To(Equal(3), "every altered read was retried")
		Expect(catalog.IDs(idx.Checkpoints)).To(Equal([]string{"a"}))

		tearing(1000, flip)
		tears = 0
		_, err = cat.VMIndex(ctx, vm)
		Expect(err).To(MatchError(objectstore.ErrTornRead))
		Expect(err).To(MatchError(And(ContainSubstring(key), ContainSubstring("its writer recorded"), ContainSubstring("after 16 attempts"))))
	})

	It("writes every document with its SHA-256", func() {
		rel, err := cat.PutVMManifest(ctx, catalog.VMBackupManifest{Namespace: vm.Namespace, Name: vm.Name,
			BackupName: "nightly", CheckpointChain: []string{"a"}})
		Expect(err).NotTo(HaveOccurred())
		_, err = cat.AddVMToBackup(ctx, "nightly", catalog.BackupVM{Namespace: vm.Namespace, Name: vm.Name, CheckpointID: "a", ManifestPath: rel})
		Expect(err).NotTo(HaveOccurred())
		for _, k := range []string{key, rel, catalog.BackupIndexPath("nightly")} {
			rc, info, err := store.Get(ctx, k, 0, 0)
			Expect(err).NotTo(HaveOccurred())
			data, err := io.ReadAll(rc)
			Expect(err).NotTo(HaveOccurred())
			Expect(info.SHA256).To(Equal(objectstore.SHA256(data)))
		}
	})

	DescribeTable("fails naming the key when every read is torn, and writes nothing",
		func(tear func([]byte) []byte, reason string) {
			tearing(1000, tear)
			before, err := store.Stat(ctx, key)
			Expect(err).NotTo(HaveOccurred())
			_, err = cat.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
				Fail("the update ran on a torn document")
				return nil
			})
			Expect(err).To(MatchError(objectstore.ErrTornRead))
			Expect(err).To(MatchError(And(ContainSubstring(key), ContainSubstring(reason), ContainSubstring("after 16 attempts"))))
			Expect(tears).To(Equal(16), "a bounded number of attempts")
			after, err := store.Stat(ctx, key)
			Expect(err).NotTo(HaveOccurred())
			Expect(after.ETag).To(Equal(before.ETag))
		},
		Entry("truncated", truncate, "bytes"),
		Entry("other bytes", flip, "its writer recorded"),
	)
})
