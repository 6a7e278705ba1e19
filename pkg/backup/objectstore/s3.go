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
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/encrypt"
)

// Defaults for multipart transfers: two 8 MiB parts in flight keep an
// upload's buffers at 16 MiB whatever the object's size, and the mover
// pod, whose binary alone takes some 34 MiB, under 64 MiB.
const (
	DefaultPartSize        = 8 << 20
	DefaultPartConcurrency = 2
	defaultRegion          = "us-east-1"
)

// S3 is a Store on an S3-compatible bucket.
type S3 struct {
	client      *minio.Client
	bucket      string
	prefix      string
	partSize    int64
	concurrency int
	// buffers holds the part buffers of uploads, PartSize times
	// PartConcurrency bytes at most, shared by the stores At returns.
	buffers *bufferPool
	// What the location asks of every write: a checksum (none when not
	// set), the store's encryption (nil for the bucket's default), tags.
	checksum minio.ChecksumType
	sse      encrypt.ServerSide
	tags     map[string]string
}

// NewS3 connects to the bucket cfg names; its keys are relative to
// cfg.Prefix. It does not contact the server; Check does.
func NewS3(cfg Config) (*S3, error) {
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("s3: bucket is empty")
	}
	endpoint, secure, err := parseEndpoint(cfg.S3URL, cfg.Region)
	if err != nil {
		return nil, err
	}
	creds, err := credentialsFor(cfg)
	if err != nil {
		return nil, err
	}
	region := cfg.Region
	if region == "" {
		region = defaultRegion
	}
	lookup := minio.BucketLookupAuto
	if cfg.S3ForcePathStyle {
		lookup = minio.BucketLookupPath
	}
	transport, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, fmt.Errorf("s3: transport: %w", err)
	}
	if secure {
		// minio's transport requires TLS 1.2; the location adds its CA
		// bundle to the system's, or turns verification off.
		if len(cfg.CACert) > 0 {
			if transport.TLSClientConfig.RootCAs, err = certPool(cfg.CACert); err != nil {
				return nil, err
			}
		}
		transport.TLSClientConfig.InsecureSkipVerify = cfg.InsecureSkipTLSVerify //nolint:gosec // the BSL asked for it
	}
	checksum := checksumTypes[cfg.ChecksumAlgorithm]
	client, err := minio.New(endpoint, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Region:       region,
		BucketLookup: lookup,
		Transport:    transport,
	})
	if err != nil {
		return nil, fmt.Errorf("s3: client for %s: %w", endpoint, err)
	}
	s := &S3{client: client, bucket: cfg.Bucket, prefix: strings.Trim(cfg.Prefix, "/"),
		partSize: cfg.PartSize, concurrency: cfg.PartConcurrency,
		checksum: checksum, sse: serverSideEncryption(cfg), tags: cfg.Tags}
	if s.partSize <= 0 {
		s.partSize = DefaultPartSize
	}
	if s.concurrency <= 0 {
		s.concurrency = DefaultPartConcurrency
	}
	s.buffers = newBufferPool(s.partSize * int64(s.concurrency))
	return s, nil
}

// serverSideEncryption is what the location asks of the store's
// encryption, as Velero's plugin asks it: a KMS key means aws:kms (or
// aws:kms:dsse) with that key.
func serverSideEncryption(cfg Config) encrypt.ServerSide {
	algorithm := cfg.ServerSideEncryption
	if cfg.KMSKeyID != "" && algorithm == "" {
		algorithm = "aws:kms"
	}
	switch algorithm {
	case "":
		return nil
	case "AES256":
		return encrypt.NewSSE()
	default:
		return storeEncryption{algorithm: algorithm, key: cfg.KMSKeyID}
	}
}

// storeEncryption asks for KMS encryption by its header values: minio-go
// knows aws:kms but not aws:kms:dsse.
type storeEncryption struct {
	algorithm, key string
}

func (e storeEncryption) Type() encrypt.Type { return encrypt.KMS }

func (e storeEncryption) Marshal(h http.Header) {
	h.Set(encrypt.SseGenericHeader, e.algorithm)
	if e.key != "" {
		h.Set(encrypt.SseKmsKeyID, e.key)
	}
}

// writeOptions are the options of a new object, as the location asks.
func (s *S3) writeOptions(opts PutOptions) minio.PutObjectOptions {
	return minio.PutObjectOptions{ContentType: opts.ContentType, UserMetadata: userMetadata(opts),
		ServerSideEncryption: s.sse, UserTags: s.tags}
}

// At returns a store on the same bucket and connection whose keys are
// relative to prefix, a path from the bucket's top (not from s's prefix).
func (s *S3) At(prefix string) *S3 {
	c := *s
	c.prefix = strings.Trim(prefix, "/")
	return &c
}

func parseEndpoint(s3URL, region string) (host string, secure bool, err error) {
	if s3URL == "" {
		if region == "" {
			region = defaultRegion
		}
		return "s3." + region + ".amazonaws.com", true, nil
	}
	u, err := url.Parse(s3URL)
	if err != nil {
		return "", false, fmt.Errorf("s3Url %q: want scheme://host[:port]: %w", s3URL, err)
	}
	switch u.Scheme {
	case "http":
	case "https":
		secure = true
	default:
		return "", false, fmt.Errorf("s3Url %q: scheme must be http or https", s3URL)
	}
	if u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("s3Url %q: want scheme://host[:port] without a path", s3URL)
	}
	return u.Host, secure, nil
}

// Check verifies the bucket is reachable, as Velero does before it marks a
// location Available.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err != nil {
		return fmt.Errorf("s3: bucket %s: %w%s", s.bucket, err, tlsHint(err))
	}
	if !ok {
		return fmt.Errorf("s3: bucket %s does not exist", s.bucket)
	}
	return nil
}

// tlsHint tells what to do about a server certificate no trusted
// authority signed.
func tlsHint(err error) string {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return " (trust the authority that signed the server's certificate: put its PEM bundle in the location's spec.objectStorage.caCert)"
	}
	return ""
}

// CreateBucket makes the bucket if it is missing (for tests and first use).
func (s *S3) CreateBucket(ctx context.Context) error {
	ok, err := s.client.BucketExists(ctx, s.bucket)
	if err == nil && ok {
		return nil
	}
	if err := s.client.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{}); err != nil {
		return fmt.Errorf("s3: create bucket %s: %w", s.bucket, err)
	}
	return nil
}

func (s *S3) key(k string) string {
	if s.prefix == "" {
		return k
	}
	return path.Join(s.prefix, k)
}

func (s *S3) unkey(k string) string {
	if s.prefix == "" {
		return k
	}
	return strings.TrimPrefix(k, s.prefix+"/")
}

// Get implements Store. The object is read with one GET whose own headers
// give its size and checksum: a lazily opened minio.Object takes the size
// from an earlier HEAD, so an object replaced by a larger one between the
// two is cut at the old size and read as if whole.
func (s *S3) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, ObjectInfo, error) {
	var opts minio.GetObjectOptions
	ranged := offset > 0 || length > 0
	if ranged {
		end := int64(0) // to the object's end
		if length > 0 {
			end = offset + length - 1
		}
		if err := opts.SetRange(offset, end); err != nil {
			return nil, ObjectInfo{}, fmt.Errorf("s3: get %s: %w", key, err)
		}
	} else {
		// Not opts.Checksum: minio-go would verify at EOF with an error
		// of its own; callers verify with Verify.
		opts.Set("x-amz-checksum-mode", "ENABLED")
	}
	body, st, header, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, s.key(key), opts)
	if err != nil {
		return nil, ObjectInfo{}, s.wrap("get", key, err)
	}
	info := s.info(st)
	if ranged {
		// Content-Range is "bytes first-last/size".
		_, total, ok := strings.Cut(header.Get("Content-Range"), "/")
		if info.Size, err = strconv.ParseInt(total, 10, 64); !ok || err != nil {
			body.Close()
			return nil, ObjectInfo{}, fmt.Errorf("s3: get %s from %d: Content-Range %q names no size", key, offset, header.Get("Content-Range"))
		}
	} else {
		info.Checksum = checksum(st)
		info.SHA256 = st.UserMetadata[metaSHA256]
	}
	return &objectReader{body: body, s: s, key: key}, info, nil
}

// metaSHA256 is the user metadata (x-amz-meta-…) that keeps
// PutOptions.SHA256, in the canonical form minio-go reports it in.
const metaSHA256 = "Kubevirt-Datamover-Sha256"

// userMetadata is what a write keeps as the object's user metadata, in a
// map of its own, which the write may add headers to.
func userMetadata(opts PutOptions) map[string]string {
	meta := map[string]string{}
	if opts.SHA256 != "" {
		meta[metaSHA256] = opts.SHA256
	}
	return meta
}

// checksum picks the whole-object checksum a GET reported, if any; a
// multipart object's composite checksum covers its parts, not its bytes.
func checksum(st minio.ObjectInfo) Checksum {
	if st.ChecksumMode == "COMPOSITE" {
		return Checksum{}
	}
	for _, c := range []Checksum{
		{"CRC64NVME", st.ChecksumCRC64NVME}, {"CRC32C", st.ChecksumCRC32C}, {"CRC32", st.ChecksumCRC32},
		{"SHA256", st.ChecksumSHA256}, {"SHA1", st.ChecksumSHA1},
	} {
		if c.Value != "" && !strings.Contains(c.Value, "-") {
			return c
		}
	}
	return Checksum{}
}

// objectReader maps the errors of a streaming read like the other calls.
// A body shorter than its Content-Length ends in io.ErrUnexpectedEOF.
type objectReader struct {
	body io.ReadCloser
	s    *S3
	key  string
}

func (r *objectReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("s3: read %s: the body ended before its Content-Length: %w", r.key, ErrTornRead)
	case err != nil && !errors.Is(err, io.EOF):
		err = r.s.wrap("read", r.key, err)
	}
	return n, err
}

func (r *objectReader) Close() error { return r.body.Close() }

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	st, err := s.client.StatObject(ctx, s.bucket, s.key(key), minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.wrap("stat", key, err)
	}
	return s.info(st), nil
}

// Put implements Store. An object larger than a part, or of unknown size,
// is a multipart upload whose part buffers are reused from a pool of
// PartConcurrency buffers of PartSize (putMultipart); a smaller one, or a
// conditional write, is one PUT streamed from r.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (ObjectInfo, error) {
	if opts.Condition == (Condition{}) && (size < 0 || size > s.partSize) {
		return s.putMultipart(ctx, key, r, size, opts)
	}
	if size < 0 {
		return ObjectInfo{}, fmt.Errorf("s3: put %s: a conditional write needs the size", key)
	}
	po := s.writeOptions(opts)
	po.DisableMultipart = true
	if po.ContentType == "" {
		po.ContentType = "application/octet-stream"
	}
	if opts.Condition.IfMatch != "" {
		po.SetMatchETag(opts.Condition.IfMatch)
	}
	if opts.Condition.IfNoneMatch {
		po.SetMatchETagExcept("*")
	}
	var up minio.UploadInfo
	var err error
	if s.checksum.IsSet() {
		up, err = s.putWithChecksum(ctx, key, r, size, po)
	} else {
		up, err = s.client.PutObject(ctx, s.bucket, s.key(key), r, size, po)
	}
	if err != nil {
		return ObjectInfo{}, s.wrap("put", key, err)
	}
	return ObjectInfo{Key: key, Size: up.Size, ETag: strings.Trim(up.ETag, `"`), LastModified: up.LastModified}, nil
}

// putWithChecksum sends a small object with the checksum the location
// asks for, in a header: it is read first, as a buffered part is, and
// signed with its SHA-256. (minio-go would send it after the body, in a
// trailer, which not every S3-compatible store reads right.)
func (s *S3) putWithChecksum(ctx context.Context, key string, r io.Reader, size int64, po minio.PutObjectOptions) (minio.UploadInfo, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return minio.UploadInfo{}, fmt.Errorf("read: %w", err)
	}
	po.UserMetadata[s.checksum.Key()] = s.checksumOf(data)
	po.DisableContentSha256 = true
	sum := sha256.Sum256(data)
	return minio.Core{Client: s.client}.PutObject(ctx, s.bucket, s.key(key), bytes.NewReader(data), size, "", hex.EncodeToString(sum[:]), po)
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	err := s.client.RemoveObject(ctx, s.bucket, s.key(key), minio.RemoveObjectOptions{})
	if err != nil {
		if err := s.wrap("delete", key, err); !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// List implements Store.
func (s *S3) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	full := s.key(prefix)
	if strings.HasSuffix(prefix, "/") && !strings.HasSuffix(full, "/") {
		full += "/"
	}
	var out []ObjectInfo
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: full, Recursive: true}) {
		if obj.Err != nil {
			return nil, s.wrap("list", prefix, obj.Err)
		}
		out = append(out, s.info(obj))
	}
	return out, nil
}

func (s *S3) info(o minio.ObjectInfo) ObjectInfo {
	return ObjectInfo{Key: s.unkey(o.Key), Size: o.Size, ETag: strings.Trim(o.ETag, `"`), LastModified: o.LastModified}
}

// wrap maps S3 error responses onto the package's sentinel errors.
func (s *S3) wrap(op, key string, err error) error {
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchBucket:
		return fmt.Errorf("s3: %s %s: bucket %s does not exist: %w", op, key, s.bucket, err)
	case resp.StatusCode == http.StatusNotFound || resp.Code == minio.NoSuchKey:
		return fmt.Errorf("s3: %s %s: %w", op, key, ErrNotFound)
	case resp.StatusCode == http.StatusPreconditionFailed || resp.StatusCode == http.StatusConflict && resp.Code == "ConditionalRequestConflict":
		return fmt.Errorf("s3: %s %s: %w", op, key, ErrPreconditionFailed)
	}
	return fmt.Errorf("s3: %s %s: %w%s", op, key, err, tlsHint(err))
}

// Retryable reports whether a transfer that failed with err may pass when
// started again. Not when the context ended, nor when the store refused the
// request itself: a 4xx answer such as 403, 404 or 412, other than 408 and
// 429, which ask to come back later. minio-go has already retried each
// request; a retry here restarts the whole transfer.
func Retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrNotFound) || errors.Is(err, ErrPreconditionFailed) {
		return false
	}
	var resp minio.ErrorResponse
	if !errors.As(err, &resp) {
		return true
	}
	code := resp.StatusCode
	return code < 400 || code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests
}
