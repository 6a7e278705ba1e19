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

package backup_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// loadBSL reads a BSL manifest and a credentials file, as the CLI and the
// pods do.
func loadBSL(bsl, credentials string) objectstore.Config {
	path := filepath.Join(GinkgoT().TempDir(), "bsl.yaml")
	Expect(os.WriteFile(path, []byte(bsl), 0o600)).To(Succeed())
	cfg, err := objectstore.LoadBSL(path, credentials)
	Expect(err).NotTo(HaveOccurred())
	return cfg
}

// newStore connects to a fresh bucket on srv through a BSL manifest and a
// credentials file; its keys are under the location's prefix.
func newStore(ctx context.Context, bsl, credentials string, tune func(*objectstore.Config)) *objectstore.S3 {
	cfg := loadBSL(bsl, credentials)
	if tune != nil {
		tune(&cfg)
	}
	store, err := objectstore.NewS3(cfg)
	Expect(err).NotTo(HaveOccurred())
	Expect(store.CreateBucket(ctx)).To(Succeed())
	Expect(store.Check(ctx)).To(Succeed())
	return store
}

// newRepository opens the datamover's repository of a fresh bucket on srv
// as the CLI and the pods do.
func newRepository(ctx context.Context, bsl, credentials string) *backup.Repository {
	newStore(ctx, bsl, credentials, nil)
	repo, err := backup.Open(loadBSL(bsl, credentials))
	Expect(err).NotTo(HaveOccurred())
	return repo
}

func put(ctx context.Context, s objectstore.Store, key, body string, cond objectstore.Condition) (objectstore.ObjectInfo, error) {
	return s.Put(ctx, key, strings.NewReader(body), int64(len(body)), objectstore.PutOptions{Condition: cond})
}

var _ = Describe("the S3 server", func() {
	var (
		ctx   context.Context
		store *objectstore.S3
	)
	BeforeEach(func(c SpecContext) {
		ctx = context.Background()
		srv := startS3(c)
		creds, err := srv.WriteCredentials(GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		store = newStore(ctx, srv.BSL("backups", "cluster-a"), creds, func(c *objectstore.Config) {
			c.PartSize = 5 << 20 // S3's smallest part, to exercise multipart
		})
	})

	DescribeTable("enforces conditional writes",
		func(cond func(first objectstore.ObjectInfo) objectstore.Condition, wantErr error) {
			first, err := put(ctx, store, "doc", "one", objectstore.Condition{IfNoneMatch: true})
			Expect(err).NotTo(HaveOccurred())
			_, err = put(ctx, store, "doc", "two", objectstore.Condition{}) // someone else's write
			Expect(err).NotTo(HaveOccurred())
			_, err = put(ctx, store, "doc", "three", cond(first))
			if wantErr == nil {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(MatchError(wantErr))
			rc, _, err := store.Get(ctx, "doc", 0, 0)
			Expect(err).NotTo(HaveOccurred())
			defer rc.Close()
			Expect(io.ReadAll(rc)).To(BeEquivalentTo("two"), "the losing write must not land")
		},
		Entry("If-None-Match on an existing object", func(objectstore.ObjectInfo) objectstore.Condition {
			return objectstore.Condition{IfNoneMatch: true}
		}, objectstore.ErrPreconditionFailed),
		Entry("If-Match with a stale ETag", func(first objectstore.ObjectInfo) objectstore.Condition {
			return objectstore.Condition{IfMatch: first.ETag}
		}, objectstore.ErrPreconditionFailed),
		Entry("an unconditional write", func(objectstore.ObjectInfo) objectstore.Condition {
			return objectstore.Condition{}
		}, nil),
	)

	It("loses no update when many writers change one index at once, and readers see only whole indexes", func() {
		cat := catalog.New(store)
		vm := catalog.VM{Namespace: "ns", Name: "vm"}
		const writers, each, readers = 8, 4, 2
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				defer GinkgoRecover()
				for i := 0; i < each; i++ {
					_, err := cat.UpdateVMIndex(ctx, vm, func(idx *catalog.VMIndex) error {
						idx.Checkpoints = append(idx.Checkpoints, catalog.CheckpointEntry{ID: fmt.Sprintf("w%d-%d", w, i), Type: catalog.Full})
						return nil
					})
					Expect(err).NotTo(HaveOccurred())
				}
			}(w)
		}
		// Readers race the writers' replacements of the object: each read
		// is a whole index, never fewer checkpoints than a read before it.
		written := make(chan struct{})
		var readersDone sync.WaitGroup
		for r := 0; r < readers; r++ {
			readersDone.Add(1)
			go func() {
				defer readersDone.Done()
				defer GinkgoRecover()
				seen := 0
				for {
					idx, err := cat.VMIndex(ctx, vm)
					Expect(err).NotTo(HaveOccurred())
					Expect(len(idx.Checkpoints)).To(BeNumerically(">=", seen))
					seen = len(idx.Checkpoints)
					select {
					case <-written:
						return
					default:
					}
				}
			}()
		}
		wg.Wait()
		close(written)
		readersDone.Wait()
		idx, err := cat.VMIndex(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(writers * each))
	})

	It("streams a multipart object under the BSL prefix and back", func() {
		data := make([]byte, 23<<20)
		_, err := rand.Read(data)
		Expect(err).NotTo(HaveOccurred())
		info, err := store.Put(ctx, "big", strings.NewReader(string(data)), int64(len(data)), objectstore.PutOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(info.ETag).To(HaveSuffix("-5"), "five parts of 5 MiB")
		objs, err := store.List(ctx, "")
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(ConsistOf(HaveField("Key", "big")))
		rc, _, err := store.Get(ctx, "big", 7<<20, 0)
		Expect(err).NotTo(HaveOccurred())
		defer rc.Close()
		tail, err := io.ReadAll(rc)
		Expect(err).NotTo(HaveOccurred())
		Expect(sha256.Sum256(tail)).To(Equal(sha256.Sum256(data[7<<20:])))

		// A range of a given length, from the start and from within,
		// names the whole object's size.
		for _, r := range [][2]int64{{0, 104}, {5<<20 - 10, 64 << 10}} {
			rc, info, err := store.Get(ctx, "big", r[0], r[1])
			Expect(err).NotTo(HaveOccurred())
			got, err := io.ReadAll(rc)
			rc.Close()
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(data[r[0] : r[0]+r[1]]))
			Expect(info.Size).To(Equal(int64(len(data))))
		}
	})

	It("reports a missing object as such", func() {
		_, err := store.Stat(ctx, "nothing")
		Expect(err).To(MatchError(objectstore.ErrNotFound))
		_, _, err = store.Get(ctx, "nothing", 0, 0)
		Expect(err).To(MatchError(objectstore.ErrNotFound))
		Expect(store.Delete(ctx, "nothing")).To(Succeed())
	})
})
