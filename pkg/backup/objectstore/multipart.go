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
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"
)

// S3's limits on multipart uploads.
const (
	maxParts    = 10000
	minPartSize = 5 << 20
	maxPartSize = 5 << 30
)

// PartPlan is how an object is cut into parts.
type PartPlan struct {
	// PartSize is the size of every part but the last.
	PartSize int64
	// Buffered is how many parts are read ahead into buffers and sent
	// at once. Zero means each part streams from the reader while it is
	// sent, one part at a time, without a buffer: a part too large for
	// the budget.
	Buffered int
}

// planParts cuts an object of size bytes (-1 when unknown) into parts of
// at least partSize, as few as S3's 10,000 parts allow, rounded up to a
// MiB, and holds at most budget bytes of them in buffers, at most
// concurrency parts. An object of unknown size is always buffered: its
// last part's length is known only once read.
func planParts(size, partSize, budget int64, concurrency int) (PartPlan, error) {
	p := max(partSize, minPartSize)
	if size > p*maxParts {
		p = ((size+maxParts-1)/maxParts + 1<<20 - 1) &^ (1<<20 - 1)
	}
	if p > maxPartSize {
		return PartPlan{}, fmt.Errorf("%d bytes need parts of %d bytes, more than S3 accepts (%d)", size, p, int64(maxPartSize))
	}
	plan := PartPlan{PartSize: p, Buffered: int(min(int64(concurrency), budget/p))}
	if size < 0 {
		plan.Buffered = max(plan.Buffered, 1)
	}
	return plan, nil
}

// bufferPool lends part buffers. At most budget bytes of buffers exist at
// once, lent or idle; idle ones are kept for the next upload, so a pod
// that uploads disk after disk reuses the same memory. The buffers are
// mapped outside the Go heap: the collector neither scans them nor lets
// the heap grow to twice their size before it runs, which would double
// what an upload holds.
type bufferPool struct {
	budget int64

	mu    sync.Mutex
	freed *sync.Cond
	size  int      // of the idle buffers
	idle  [][]byte // reused first
	bytes int64    // of every buffer, lent or idle
}

func newBufferPool(budget int64) *bufferPool {
	p := &bufferPool{budget: budget}
	p.freed = sync.NewCond(&p.mu)
	return p
}

// get returns a buffer of size bytes, waiting while the budget is spent.
// A size other than the idle buffers' drops them.
func (p *bufferPool) get(size int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if size != p.size {
			for _, b := range p.idle {
				p.release(b)
			}
			p.idle, p.size = nil, size
		}
		if n := len(p.idle); n > 0 {
			b := p.idle[n-1]
			p.idle = p.idle[:n-1]
			return b
		}
		if p.bytes+int64(size) <= p.budget || p.bytes == 0 {
			p.bytes += int64(size)
			return mapBuffer(size)
		}
		p.freed.Wait()
	}
}

// put gives a buffer back; no reader may still use it.
func (p *bufferPool) put(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b) == p.size {
		p.idle = append(p.idle, b)
	} else {
		p.release(b)
	}
	p.freed.Broadcast()
}

func (p *bufferPool) release(b []byte) {
	p.bytes -= int64(len(b))
	_ = unix.Munmap(b) // fails for a heap buffer (mapBuffer's fallback), the collector's
}

// allocated is how many bytes of buffers exist.
func (p *bufferPool) allocated() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// mapBuffer maps size bytes of anonymous memory, or allocates them on the
// heap if the system refuses.
func mapBuffer(size int) []byte {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, size)
	}
	return b
}

// partReader is the body of one part request. net/http may read a body
// after the request has returned (until it closes it, which minio-go
// hides): once detached, the reader no longer touches its buffer, which
// can go back to the pool.
type partReader struct {
	mu  sync.Mutex
	b   []byte
	off int64
}

var errDetached = errors.New("part buffer given back: the request is over")

func (r *partReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return 0, errDetached
	}
	if r.off >= int64(len(r.b)) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.off:])
	r.off += int64(n)
	return n, nil
}

// Seek lets minio-go send the part again after a failed attempt.
func (r *partReader) Seek(offset int64, whence int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += int64(len(r.b))
	default:
		return 0, fmt.Errorf("seek: whence %d", whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek to %d", offset)
	}
	r.off = offset
	return offset, nil
}

func (r *partReader) detach() {
	r.mu.Lock()
	r.b = nil
	r.mu.Unlock()
}

// putMultipart sends r as a multipart upload. One goroutine reads r in
// order, part after part, into buffers of the pool, which part uploads
// send and give back; r is read exactly once. Parts that fit no buffer
// stream from r while they are sent, one after another. Fewer or more than
// size bytes (when size is known), or any failed part, abort the upload:
// no object appears.
func (s *S3) putMultipart(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (info ObjectInfo, err error) {
	plan, err := planParts(size, s.partSize, s.buffers.budget, s.concurrency)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("s3: put %s: %w", key, err)
	}
	core := minio.Core{Client: s.client}
	object := s.key(key)
	create := s.writeOptions(opts)
	// Every part then carries a checksum, and the object keeps the
	// checksum of theirs, as the AWS SDK's uploads do. Parts too large for
	// the buffers stream from r while they are sent, before their checksum
	// could be known: such an object gets none (its SHA-256 is still kept
	// for readers).
	withChecksum := s.checksum.IsSet() && plan.Buffered > 0
	if withChecksum {
		create.UserMetadata["x-amz-checksum-algorithm"] = s.checksum.String()
	}
	uploadID, err := core.NewMultipartUpload(ctx, s.bucket, object, create)
	if err != nil {
		return ObjectInfo{}, s.wrap("put", key, err)
	}
	defer func() {
		if err != nil {
			// Without its completion the upload is no object; abort
			// frees the parts sent (a server that misses the abort
			// expires them by its lifecycle rules).
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = core.AbortMultipartUpload(actx, s.bucket, object, uploadID)
		}
	}()
	parts, total, err := s.sendParts(ctx, core, key, uploadID, r, size, plan, withChecksum)
	if err != nil {
		return ObjectInfo{}, err
	}
	up, err := core.CompleteMultipartUpload(ctx, s.bucket, object, uploadID, parts, minio.PutObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.wrap("put", key, err)
	}
	return ObjectInfo{Key: key, Size: total, ETag: strings.Trim(up.ETag, `"`), LastModified: up.LastModified}, nil
}

// sendParts reads r to its end (or size bytes) and sends it as the parts of
// uploadID, returning them in order and the bytes read.
func (s *S3) sendParts(ctx context.Context, core minio.Core, key, uploadID string, r io.Reader, size int64, plan PartPlan, withChecksum bool) ([]minio.CompletePart, int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		parts []minio.CompletePart
		total int64
	)
	// send sends a part, with its checksum when the object gets one.
	send := func(n int, body io.Reader, length int64, opts minio.PutObjectPartOptions, checksum string) {
		p, err := core.PutObjectPart(ctx, s.bucket, s.key(key), uploadID, n, body, length, opts)
		if err != nil {
			cancel(s.wrap(fmt.Sprintf("put part %d of", n), key, err))
			return
		}
		part := minio.CompletePart{PartNumber: n, ETag: p.ETag}
		if checksum != "" {
			setPartChecksum(&part, s.checksum, checksum)
		}
		mu.Lock()
		parts = append(parts, part)
		mu.Unlock()
	}
	// A buffered part is signed with its sha256, which the server
	// checks, rather than with minio-go's streaming signature, which
	// would copy it again in 64 KiB chunks, each signed. Its checksum,
	// if asked for, goes in a header.
	sendBuffer := func(n int, part []byte) {
		body := &partReader{b: part}
		defer body.detach()
		sum := sha256.Sum256(part)
		opts := minio.PutObjectPartOptions{Sha256Hex: hex.EncodeToString(sum[:]), DisableContentSha256: true}
		checksum := ""
		if withChecksum {
			checksum = s.checksumOf(part)
			opts.CustomHeader = http.Header{s.checksum.Key(): {checksum}}
		}
		send(n, body, int64(len(part)), opts, checksum)
	}
	inFlight := make(chan struct{}, max(plan.Buffered, 1))
	for n := 1; ctx.Err() == nil; n++ {
		if size >= 0 && total == size && n > 1 {
			break
		}
		if n > maxParts {
			cancel(fmt.Errorf("s3: put %s: more than %d parts of %d bytes", key, maxParts, plan.PartSize))
			break
		}
		length := plan.PartSize
		if size >= 0 {
			length = min(length, size-total)
		}
		if plan.Buffered == 0 {
			// In turn, straight from r: a part shorter than its
			// length fails its request.
			body := &countingReader{r: io.LimitReader(r, length)}
			send(n, body, length, minio.PutObjectPartOptions{}, "")
			total += body.n
			continue
		}
		select {
		case inFlight <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		buf := s.buffers.get(int(plan.PartSize))
		m, err := io.ReadFull(r, buf[:length])
		total += int64(m)
		// io.ReadFull returns these sentinels as they are: r ended. A
		// wrapped one is r failing.
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			if size >= 0 {
				cancel(fmt.Errorf("s3: put %s: the reader ended after %d bytes, %d were announced: %w", key, total, size, io.ErrUnexpectedEOF))
			} else if m > 0 || n == 1 {
				sendBuffer(n, buf[:m]) // the last part
			}
			s.buffers.put(buf)
			<-inFlight
			wg.Wait()
			return s.finishParts(ctx, key, r, size, total, parts)
		default:
			cancel(fmt.Errorf("s3: put %s: read: %w", key, err))
		}
		if ctx.Err() != nil {
			s.buffers.put(buf)
			<-inFlight
			break
		}
		wg.Add(1)
		go func(n int, part []byte) {
			defer wg.Done()
			defer func() { s.buffers.put(buf); <-inFlight }()
			sendBuffer(n, part)
		}(n, buf[:m])
	}
	wg.Wait()
	return s.finishParts(ctx, key, r, size, total, parts)
}

// finishParts checks that the parts are whole: no failure, and exactly
// size bytes when size is known.
func (s *S3) finishParts(ctx context.Context, key string, r io.Reader, size, total int64, parts []minio.CompletePart) ([]minio.CompletePart, int64, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, total, err
	}
	if size >= 0 {
		if total != size {
			return nil, total, fmt.Errorf("s3: put %s: the reader gave %d bytes, %d were announced: %w", key, total, size, io.ErrUnexpectedEOF)
		}
		var one [1]byte
		if n, _ := io.ReadFull(r, one[:]); n > 0 {
			return nil, total, fmt.Errorf("s3: put %s: the reader has more than the %d bytes announced", key, size)
		}
	}
	slices.SortFunc(parts, func(a, b minio.CompletePart) int { return a.PartNumber - b.PartNumber })
	return parts, total, nil
}

// checksumOf is data's checksum by the location's algorithm, in base64.
func (s *S3) checksumOf(data []byte) string {
	h := s.checksum.Hasher()
	h.Write(data)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// setPartChecksum records a part's checksum where CompleteMultipartUpload
// sends it.
func setPartChecksum(part *minio.CompletePart, t minio.ChecksumType, value string) {
	switch t {
	case minio.ChecksumCRC32:
		part.ChecksumCRC32 = value
	case minio.ChecksumCRC32C:
		part.ChecksumCRC32C = value
	case minio.ChecksumSHA1:
		part.ChecksumSHA1 = value
	case minio.ChecksumSHA256:
		part.ChecksumSHA256 = value
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
