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
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// fault is what the proxy does to one part upload.
type fault int

const (
	pass      fault = iota
	slowDown        // 503 SlowDown, which a client retries
	forbidden       // 403 AccessDenied, which no retry mends
	cut             // the connection drops after 1 MiB of the part
)

// faultyProxy stands between the client and the S3 server and does to each
// part upload (PUT ?partNumber=) what fault says, by part number and
// attempt (1 for the first request of a part).
type faultyProxy struct {
	*httptest.Server
	mu     sync.Mutex
	sent   map[int]int
	fault  func(part, attempt int) fault
	target *url.URL
	// alter, when set, gives the body the client gets for the n-th
	// (from 0) whole GET of path in place of body, of the same length,
	// and the proxy drops the store's checksums from every GET's
	// answer: a store that keeps none, on a path that alters bytes.
	alter func(path string, n int, body []byte) []byte
	gets  map[string]int
}

// altering makes the proxy alter GET answers with alter.
func (p *faultyProxy) altering(alter func(path string, n int, body []byte) []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.alter = alter
}

// alterGet is the reverse proxy's ModifyResponse.
func (p *faultyProxy) alterGet(resp *http.Response) error {
	p.mu.Lock()
	alter := p.alter
	path := resp.Request.URL.Path
	n := p.gets[path]
	p.mu.Unlock()
	if alter == nil || resp.Request.Method != http.MethodGet || resp.StatusCode != http.StatusOK || resp.Request.Header.Get("Range") != "" {
		return nil
	}
	p.mu.Lock()
	p.gets[path]++
	p.mu.Unlock()
	for h := range resp.Header {
		if strings.HasPrefix(strings.ToLower(h), "x-amz-checksum-") {
			resp.Header.Del(h)
		}
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(alter(path, n, body)))
	return nil
}

func newFaultyProxy(srv *s3server.Server, f func(part, attempt int) fault) *faultyProxy {
	target, err := url.Parse(srv.URL)
	Expect(err).NotTo(HaveOccurred())
	p := &faultyProxy{sent: map[int]int{}, fault: f, target: target, gets: map[string]int{}}
	// The client signs the Host it dials, the proxy's; the proxy keeps
	// it, so the server checks the signature against what was signed.
	forward := httputil.NewSingleHostReverseProxy(target)
	// Requests the client gives up on after a failure end in "context
	// canceled": the spec's log, not the terminal's.
	forward.ErrorLog = log.New(GinkgoWriter, "proxy: ", 0)
	forward.ModifyResponse = p.alterGet
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		part, err := strconv.Atoi(r.URL.Query().Get("partNumber"))
		if r.Method != http.MethodPut || err != nil {
			forward.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		p.sent[part]++
		attempt := p.sent[part]
		p.mu.Unlock()
		switch p.fault(part, attempt) {
		case slowDown:
			s3Error(w, r, http.StatusServiceUnavailable, "SlowDown")
		case forbidden:
			s3Error(w, r, http.StatusForbidden, "AccessDenied")
		case cut:
			_, _ = io.CopyN(io.Discard, r.Body, 1<<20)
			conn, _, err := http.NewResponseController(w).Hijack()
			Expect(err).NotTo(HaveOccurred())
			_ = conn.Close()
		default:
			forward.ServeHTTP(w, r)
		}
	}))
	DeferCleanup(p.Close)
	return p
}

func s3Error(w http.ResponseWriter, r *http.Request, status int, code string) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by the test</Message></Error>`, code)
}

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }

func fileSHA256(path string) string {
	f, err := os.Open(path)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	Expect(err).NotTo(HaveOccurred())
	return hex.EncodeToString(h.Sum(nil))
}

// attempts is how many requests the proxy saw for each part.
func (p *faultyProxy) attempts() map[int]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int]int{}
	for k, v := range p.sent {
		out[k] = v
	}
	return out
}

var _ = Describe("transfers through a failing S3 server", func() {
	const bucket, prefix = "backups", "cluster-a"
	var (
		ctx   context.Context
		srv   *s3server.Server
		creds string
		work  string
		vm    = catalog.VM{Namespace: "prod", Name: "db"}
	)
	BeforeEach(func(c SpecContext) {
		ctx = context.Background()
		srv = startS3(c)
		var err error
		creds, err = srv.WriteCredentials(GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		work = GinkgoT().TempDir()
	})

	// through opens the datamover's repository through the proxy, with
	// parts of 5 MiB, S3's smallest, so that a small disk has several.
	through := func(p *faultyProxy) (*backup.Repository, *objectstore.S3) {
		cfg := srv.Config(bucket, prefix, creds)
		cfg.S3URL = p.URL
		cfg.PartSize = 5 << 20
		s3, err := objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(s3.CreateBucket(ctx)).To(Succeed())
		store := s3.At(catalog.Root(prefix))
		repo := backup.NewRepository(store)
		repo.RetryDelay = time.Millisecond
		return repo, store
	}
	// direct is a plain client of the server, to see what it holds.
	direct := func() minio.Core {
		u, err := url.Parse(srv.URL)
		Expect(err).NotTo(HaveOccurred())
		c, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
		Expect(err).NotTo(HaveOccurred())
		return minio.Core{Client: c}
	}
	noUploadsInProgress := func() {
		res, err := direct().ListMultipartUploads(ctx, bucket, "", "", "", "", 1000)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Uploads).To(BeEmpty(), "a multipart upload the client gave up on is aborted")
	}
	// disk is a stand-in VM whose 24 MiB disk is full of random data.
	disk := func() *backuptest.Hypervisor {
		hv, err := backuptest.New(ctx, GinkgoT().TempDir(), 24<<20)
		Expect(err).NotTo(HaveOccurred())
		data := make([]byte, 24<<20)
		_, err = rand.Read(data)
		Expect(err).NotTo(HaveOccurred())
		Expect(writeFile(hv.Live(), data)).To(Succeed())
		return hv
	}

	DescribeTable("resends a part the server refused or cut, from its buffer, and restores the disk byte for byte",
		func(f fault) {
			p := newFaultyProxy(srv, func(part, attempt int) fault {
				if part == 2 && attempt == 1 {
					return f
				}
				return pass
			})
			repo, _ := through(p)
			hv := disk()
			res, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b1", Checkpoint: "cp1", WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Checkpoint.Files[0].ETag).To(MatchRegexp(`-[5-9]$`), "several parts")
			sent := p.attempts()
			Expect(sent).To(HaveKeyWithValue(2, 2), "part 2 sent again")
			for part, n := range sent {
				if part != 2 {
					Expect(n).To(Equal(1), "part %d sent once", part)
				}
			}

			target := filepath.Join(work, "restored.raw")
			_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "b1", VM: vm, Disk: "vda", Target: target, WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
			Expect(qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, hv.Live(), qcow2.FormatRaw)).To(BeTrue())
			Expect(fileSHA256(target)).To(Equal(fileSHA256(hv.Live())))
			noUploadsInProgress()
		},
		Entry("503 SlowDown", slowDown),
		Entry("a connection dropped in the middle of the part", cut),
	)

	It("leaves nothing trusted when the server fails in the middle of an upload", func() {
		// Part 3 alone fails: parts go up side by side, and were part 4
		// refused too, either refusal could be the one reported.
		p := newFaultyProxy(srv, func(part, _ int) fault {
			if part == 3 {
				return forbidden
			}
			return pass
		})
		repo, store := through(p)
		hv := disk()

		// The pod's own steps, without the abort BackupVM does on failure.
		up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: "cp1", Type: catalog.Full, Backup: "b1"})
		Expect(err).NotTo(HaveOccurred())
		files, err := hv.Backup(ctx, "cp1", "", GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		_, err = up.PutDisk(ctx, "vda", files["vda"], nil)
		Expect(err).To(MatchError(ContainSubstring("part 3")))
		Expect(err).To(MatchError(ContainSubstring("injected by the test")))

		// No object, no upload left open, no checkpoint complete.
		objs, err := store.List(ctx, catalog.CheckpointDir(vm, "cp1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(BeEmpty())
		noUploadsInProgress()
		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoint("cp1").IsComplete()).To(BeFalse())
		Expect(idx.Latest()).To(BeEmpty())
		plan, err := repo.Plan(ctx, vm, backup.PlanOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(plan.Type).To(Equal(catalog.Full))
		_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "b1", VM: vm, Disk: "vda", Target: filepath.Join(work, "t.raw"), WorkDir: work})
		Expect(backup.IsNotFound(err)).To(BeTrue(), "restore: %v", err)

		// The whole backup fails the same way and takes its pending
		// checkpoint away.
		_, err = repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b2", Checkpoint: "cp2", WorkDir: work})
		Expect(err).To(MatchError(ContainSubstring("injected by the test")))
		idx, err = repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.Checkpoint("cp2")).To(BeNil())
		noUploadsInProgress()
	})

	It("trusts no document or layer whose bytes were altered on the way from a store that keeps no checksum", func() {
		p := newFaultyProxy(srv, func(int, int) fault { return pass })
		repo, _ := through(p)
		hv := disk()
		_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: "b1", Checkpoint: "cp1", WorkDir: work})
		Expect(err).NotTo(HaveOccurred())

		// The first read of each: the index says another VM name, still
		// valid JSON of the same length; the layer has a byte flipped.
		index := "/" + path.Join(bucket, catalog.Root(prefix), catalog.VMIndexPath(vm))
		layer := "/" + path.Join(bucket, catalog.Root(prefix), catalog.DiskPath(vm, "cp1", "b1", "vda"))
		p.altering(func(at string, n int, body []byte) []byte {
			switch {
			case n > 0:
			case at == index:
				altered := bytes.Replace(body, []byte(`"vmName": "db"`), []byte(`"vmName": "dz"`), 1)
				Expect(altered).NotTo(Equal(body))
				return altered
			case at == layer:
				body[len(body)/2] ^= 0xff
			}
			return body
		})
		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		Expect(idx.VMName).To(Equal("db"), "the altered index was read again")

		target := filepath.Join(work, "restored.raw")
		_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "b1", VM: vm, Disk: "vda", Target: target, WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		Expect(fileSHA256(target)).To(Equal(fileSHA256(hv.Live())))
		p.mu.Lock()
		defer p.mu.Unlock()
		Expect(p.gets[index]).To(BeNumerically(">=", 2), "the index read again")
		Expect(p.gets[layer]).To(Equal(2), "the layer read again, once")
	})

	It("stores nothing from a source shorter or longer than it announced", func() {
		p := newFaultyProxy(srv, func(int, int) fault { return pass })
		_, store := through(p)
		data := make([]byte, 12<<20)
		_, err := rand.Read(data)
		Expect(err).NotTo(HaveOccurred())

		_, err = store.Put(ctx, "short", strings.NewReader(string(data[:len(data)-1])), int64(len(data)), objectstore.PutOptions{})
		Expect(err).To(MatchError(io.ErrUnexpectedEOF))
		_, err = store.Put(ctx, "long", strings.NewReader(string(data)), int64(len(data)-1), objectstore.PutOptions{})
		Expect(err).To(MatchError(ContainSubstring("more than the")))
		objs, err := store.List(ctx, "")
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(BeEmpty())
		noUploadsInProgress()

		info, err := store.Put(ctx, "whole", strings.NewReader(string(data)), int64(len(data)), objectstore.PutOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Size).To(Equal(int64(len(data))))
		rc, _, err := store.Get(ctx, "whole", 0, 0)
		Expect(err).NotTo(HaveOccurred())
		defer rc.Close()
		got, err := io.ReadAll(rc)
		Expect(err).NotTo(HaveOccurred())
		Expect(sha256.Sum256(got)).To(Equal(sha256.Sum256(data)))
	})
})
