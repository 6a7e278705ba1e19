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
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// writeRequest is what a write the recording proxy forwarded asked of the
// store: the headers the location's keys set.
type writeRequest struct {
	kind    string // "object", "create" or "part"
	headers map[string]string
}

// recordingProxy forwards every request to the S3 server and records the
// writes.
type recordingProxy struct {
	*httptest.Server
	mu     sync.Mutex
	writes []writeRequest
}

func newRecordingProxy(target string) *recordingProxy {
	u, err := url.Parse(target)
	Expect(err).NotTo(HaveOccurred())
	p := &recordingProxy{}
	forward := httputil.NewSingleHostReverseProxy(u)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		kind := ""
		switch {
		case r.Method == http.MethodPut && q.Has("partNumber"):
			kind = "part"
		case r.Method == http.MethodPost && q.Has("uploads"):
			kind = "create"
		case r.Method == http.MethodPut && len(q) == 0 && strings.Contains(strings.Trim(r.URL.Path, "/"), "/"):
			kind = "object" // not the bucket
		}
		if kind != "" {
			headers := map[string]string{}
			for k := range r.Header {
				lk := strings.ToLower(k)
				if strings.HasPrefix(lk, "x-amz-checksum") || strings.HasPrefix(lk, "x-amz-server-side-encryption") ||
					lk == "x-amz-tagging" {
					headers[lk] = r.Header.Get(k)
				}
			}
			p.mu.Lock()
			p.writes = append(p.writes, writeRequest{kind, headers})
			p.mu.Unlock()
		}
		forward.ServeHTTP(w, r)
	}))
	DeferCleanup(p.Close)
	return p
}

func (p *recordingProxy) recorded() []writeRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]writeRequest(nil), p.writes...)
}

var _ = Describe("a location's keys on a real S3 server", func() {
	DescribeTable("sends the checksum, encryption and tags the location asks for with every write, and reads back",
		func(ctx context.Context, algorithm, encryption string, want map[string]string) {
			srv := startS3(ctx)
			proxy := newRecordingProxy(srv.URL)
			creds, err := srv.WriteCredentials(GinkgoT().TempDir())
			Expect(err).NotTo(HaveOccurred())
			cfg := srv.Config("keys", "velero", creds)
			cfg.S3URL = proxy.URL
			cfg.PartSize = 5 << 20
			manifest := "spec:\n  objectStorage:\n    bucket: keys\n  config:\n    checksumAlgorithm: " + algorithm + "\n" +
				encryption + "    tagging: team=storage&tier=backup\n"
			keys, err := objectstore.ParseBSL([]byte(manifest))
			Expect(err).NotTo(HaveOccurred())
			cfg.ChecksumAlgorithm, cfg.ServerSideEncryption, cfg.KMSKeyID, cfg.Tags = keys.ChecksumAlgorithm, keys.ServerSideEncryption, keys.KMSKeyID, keys.Tags
			store, err := objectstore.NewS3(cfg)
			Expect(err).NotTo(HaveOccurred())
			Expect(store.CreateBucket(ctx)).To(Succeed())

			small, large := make([]byte, 1<<20), make([]byte, 12<<20)
			_, _ = rand.Read(small)
			_, _ = rand.Read(large)
			for key, data := range map[string][]byte{"small": small, "large": large} {
				_, err := store.Put(ctx, key, bytes.NewReader(data), int64(len(data)), objectstore.PutOptions{SHA256: objectstore.SHA256(data)})
				Expect(err).NotTo(HaveOccurred(), key)
				r, info, err := store.Get(ctx, key, 0, 0)
				Expect(err).NotTo(HaveOccurred(), key)
				got, err := io.ReadAll(r)
				Expect(err).NotTo(HaveOccurred())
				Expect(r.Close()).To(Succeed())
				Expect(objectstore.Verify(info, got)).To(Succeed(), key)
			}

			kinds := map[string]int{}
			for _, w := range proxy.recorded() {
				kinds[w.kind]++
				switch w.kind {
				case "object", "create":
					for k, v := range want {
						Expect(w.headers).To(HaveKeyWithValue(k, v), w.kind)
					}
					Expect(w.headers).To(HaveKeyWithValue("x-amz-tagging", "team=storage&tier=backup"), w.kind)
					if w.kind == "create" {
						Expect(w.headers).To(HaveKeyWithValue("x-amz-checksum-algorithm", algorithm))
					} else {
						Expect(w.headers).To(HaveKey("x-amz-checksum-" + strings.ToLower(algorithm)))
					}
				case "part":
					Expect(w.headers).To(HaveKey("x-amz-checksum-" + strings.ToLower(algorithm)))
				}
			}
			Expect(kinds).To(Equal(map[string]int{"object": 1, "create": 1, "part": 3}))

			// The store kept the tags.
			client, err := minio.New(strings.TrimPrefix(srv.URL, "http://"), &minio.Options{
				Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Region: "us-east-1"})
			Expect(err).NotTo(HaveOccurred())
			for _, key := range []string{"small", "large"} {
				tags, err := client.GetObjectTagging(ctx, "keys", "velero/"+key, minio.GetObjectTaggingOptions{})
				Expect(err).NotTo(HaveOccurred(), key)
				Expect(tags.ToMap()).To(Equal(map[string]string{"team": "storage", "tier": "backup"}), key)
			}
		},
		Entry("CRC32C, AES256", "CRC32C", "    serverSideEncryption: AES256\n",
			map[string]string{"x-amz-server-side-encryption": "AES256"}),
		Entry("SHA256, a KMS key", "SHA256", "    kmsKeyId: alias/backups\n",
			map[string]string{"x-amz-server-side-encryption": "aws:kms", "x-amz-server-side-encryption-aws-kms-key-id": "alias/backups"}),
		Entry("CRC32, dual-layer KMS", "CRC32", "    serverSideEncryption: aws:kms:dsse\n",
			map[string]string{"x-amz-server-side-encryption": "aws:kms:dsse"}),
		Entry("SHA1, the bucket's encryption", "SHA1", "", map[string]string{}),
	)
})
