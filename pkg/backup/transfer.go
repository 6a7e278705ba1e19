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

package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/retry"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// Progress is told how many of total bytes of one object have moved. It is
// called from a ticker of its own about every Repository.ProgressInterval
// while the object moves, and once more with the final count when it has
// moved (or failed), never from the transfer itself: a slow callee delays
// only the end of the transfer, which waits for its last report.
type Progress func(object string, done, total int64)

// DefaultProgressInterval is how often progress is reported when
// Repository.ProgressInterval is zero.
const DefaultProgressInterval = time.Second

// meter counts the bytes of one transfer; the data path only adds to the
// count, a ticker reports it.
type meter struct {
	done atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
}

// track starts reporting the transfer of object, total bytes, to progress
// every r.ProgressInterval. Stop the meter when the transfer ends.
func (r *Repository) track(object string, total int64, progress Progress) *meter {
	m := &meter{stop: make(chan struct{})}
	if progress == nil {
		return m
	}
	interval := r.ProgressInterval
	if interval <= 0 {
		interval = DefaultProgressInterval
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				progress(object, m.done.Load(), total)
			case <-m.stop:
				progress(object, m.done.Load(), total)
				return
			}
		}
	}()
	return m
}

// Stop ends the reports after a last one with the final count.
func (m *meter) Stop() {
	close(m.stop)
	m.wg.Wait()
}

// counter counts bytes through a reader into a meter.
type counter struct {
	r io.Reader
	m *meter
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.m.done.Add(int64(n))
	return n, err
}

// uploaded is what an upload learnt about the object it wrote.
type uploaded struct {
	Size   int64
	SHA256 string
	ETag   string
}

// uploadFile streams a local file to key, hashing it on the way; the store
// keeps memory bounded by sending parts. A failed attempt that may pass
// starts over from the file's beginning, as r.backoff says.
func (r *Repository) uploadFile(ctx context.Context, key, path string, progress Progress) (uploaded, error) {
	f, err := os.Open(path)
	if err != nil {
		return uploaded{}, fmt.Errorf("upload %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return uploaded{}, fmt.Errorf("upload %s: %w", path, err)
	}
	var (
		h    hash.Hash
		src  *counter
		info objectstore.ObjectInfo
	)
	m := r.track(key, st.Size(), progress)
	defer m.Stop()
	err = retry.OnError(ctx, r.backoff(), objectstore.Retryable, func() (err error) {
		// Each attempt hashes what it reads, once, as the store reads
		// it; the store's own part retries resend its buffers.
		h = sha256.New()
		m.done.Store(0)
		src = &counter{r: io.TeeReader(io.NewSectionReader(f, 0, st.Size()), h), m: m}
		info, err = r.Store.Put(ctx, key, src, st.Size(), objectstore.PutOptions{})
		return err
	})
	if err != nil {
		return uploaded{}, fmt.Errorf("upload %s to %s: %w", path, key, err)
	}
	if src.n != st.Size() || info.Size != st.Size() {
		return uploaded{}, fmt.Errorf("upload %s: read %d bytes, stored %d, the file has %d (changed while uploading?)", path, src.n, info.Size, st.Size())
	}
	return uploaded{Size: st.Size(), SHA256: hex.EncodeToString(h.Sum(nil)), ETag: info.ETag}, nil
}

// ObjectError is a stored object that is not what the index recorded.
type ObjectError struct {
	Object string
	Reason string
}

func (e *ObjectError) Error() string { return fmt.Sprintf("object %s: %s", e.Object, e.Reason) }

// downloadFile streams key into w, resuming from where a broken read
// stopped, and checks the recorded size and digest. sum may be empty for
// objects recorded without one. A download whose bytes are not what the
// index recorded (a body cut short or altered on the way) is never
// trusted: it starts over from the object's beginning, as often as
// r.backoff allows, and then fails with an *ObjectError naming the key.
// An object the store itself describes otherwise (missing, or of another
// size) fails at once.
func (r *Repository) downloadFile(ctx context.Context, key string, w io.WriteSeeker, size int64, sum string, progress Progress) error {
	m := r.track(key, size, progress)
	defer m.Stop()
	attempts := r.backoff().Steps
	for attempt := 1; ; attempt++ {
		err := r.downloadOnce(ctx, key, w, size, sum, m)
		var bad *badRead
		if !errors.As(err, &bad) {
			return err
		}
		if attempt >= attempts {
			return &ObjectError{Object: key, Reason: fmt.Sprintf("%s (after %d attempts)", bad.reason, attempt)}
		}
		if _, err := w.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("download %s: start over: %w", key, err)
		}
		m.done.Store(0)
	}
}

// badRead is a download whose bytes are not the object the index
// records, while the store describes the object as recorded.
type badRead struct{ object, reason string }

func (e *badRead) Error() string { return e.reason }

// downloadOnce streams key into w from its beginning.
func (r *Repository) downloadOnce(ctx context.Context, key string, w io.Writer, size int64, sum string, m *meter) error {
	pipe := newHashPipe(sha256.New())
	var done int64
	err := retry.OnError(ctx, r.backoff(), retriableRead, func() error {
		// A read that moved bytes resumes at once: only reads that move
		// nothing count as failed attempts.
		for {
			n, err := r.copyFrom(ctx, key, w, pipe, done, size, m)
			done += n
			if err == nil || n == 0 || !retriableRead(err) {
				return err
			}
		}
	})
	got := pipe.Sum()
	var oe *ObjectError
	if errors.As(err, &oe) {
		return err
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", key, err)
	}
	if done != size {
		return &badRead{object: key, reason: fmt.Sprintf("read %d bytes, the index records %d", done, size)}
	}
	if sum != "" && hex.EncodeToString(got) != sum {
		return &badRead{object: key, reason: fmt.Sprintf("sha256 is %x, the index records %s: the object was altered", got, sum)}
	}
	return nil
}

// retriableRead tells a read worth resuming: not of an object that is not
// what the index recorded, nor one whose bytes are not what was read
// before.
func retriableRead(err error) bool {
	var (
		oe  *ObjectError
		bad *badRead
	)
	return !errors.As(err, &oe) && !errors.As(err, &bad) && objectstore.Retryable(err)
}

// Reads of a download fill buffers of copyBuffer bytes: large enough that
// few calls move a disk, small enough that a buffer is still in the CPU's
// cache when it is written and hashed after its read (1 MiB buffers,
// read from memory three times, cost a restore some 10% more CPU time),
// few enough (pipeBuffers) to be small beside the part buffers of
// uploads.
const (
	copyBuffer  = 256 << 10
	pipeBuffers = 8
)

// hashPipe hashes what a download wrote in a goroutine of its own, so that
// receiving and hashing overlap, in buffers it lends and takes back.
type hashPipe struct {
	h    hash.Hash
	free chan []byte
	full chan []byte
	done chan struct{}
}

func newHashPipe(h hash.Hash) *hashPipe {
	p := &hashPipe{h: h, free: make(chan []byte, pipeBuffers), full: make(chan []byte, pipeBuffers), done: make(chan struct{})}
	for range pipeBuffers {
		p.free <- make([]byte, copyBuffer)
	}
	go func() {
		defer close(p.done)
		for b := range p.full {
			p.h.Write(b)
			p.free <- b[:cap(b)]
		}
	}()
	return p
}

// buffer lends a buffer to fill; hand it to hash or back to reuse.
func (p *hashPipe) buffer() []byte { return <-p.free }

// hash takes b, the start of a lent buffer, to add to the digest in order.
func (p *hashPipe) hash(b []byte) { p.full <- b }

// reuse takes back a lent buffer whose bytes are not to be hashed.
func (p *hashPipe) reuse(b []byte) { p.free <- b[:cap(b)] }

// Sum waits for what was handed to hash and returns the digest. Call it
// once, with no buffer lent; it ends the goroutine.
func (p *hashPipe) Sum() []byte {
	close(p.full)
	<-p.done
	return p.h.Sum(nil)
}

// copyFrom copies key from offset on into dst, and into the digest through
// pipe, and returns how many bytes it moved.
func (r *Repository) copyFrom(ctx context.Context, key string, dst io.Writer, pipe *hashPipe, offset, size int64, m *meter) (int64, error) {
	rc, err := r.open(ctx, key, offset, 0, size)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	// Whole buffers, not what each read of the connection brings, go
	// to dst: few large writes.
	var n int64
	for {
		buf := pipe.buffer()
		k, err := io.ReadFull(rc, buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				pipe.reuse(buf)
				return n, fmt.Errorf("write %s at %d: %w", key, offset+n, werr)
			}
			pipe.hash(buf[:k])
			n += int64(k)
			m.done.Add(int64(k))
		} else {
			pipe.reuse(buf)
		}
		// io.ReadFull returns these sentinels as they are: rc ended. A
		// wrapped one is a failure to resume from, and so is a body that
		// ended before the object did.
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			if offset+n < size {
				return n, fmt.Errorf("read %s: the body ended at %d of %d bytes: %w", key, offset+n, size, objectstore.ErrTornRead)
			}
			return n, nil
		default:
			return n, fmt.Errorf("read %s at %d: %w", key, offset+n, err)
		}
	}
}

// open reads length bytes of key from offset (to its end when length is
// 0), an object of size bytes as the index records it: one the store
// does not hold, or holds with another size, is an *ObjectError.
func (r *Repository) open(ctx context.Context, key string, offset, length, size int64) (io.ReadCloser, error) {
	rc, info, err := r.Store.Get(ctx, key, offset, length)
	if errors.Is(err, objectstore.ErrNotFound) {
		return nil, &ObjectError{Object: key, Reason: "missing from the bucket"}
	}
	if err != nil {
		return nil, err
	}
	if info.Size != size {
		rc.Close()
		return nil, &ObjectError{Object: key, Reason: fmt.Sprintf("has %d bytes, the index records %d: the object was altered", info.Size, size)}
	}
	return rc, nil
}

// hashObject reads an object to the end and checks its digest.
func (r *Repository) hashObject(ctx context.Context, key string, size int64, sum string) error {
	return r.downloadFile(ctx, key, discard{}, size, sum, nil)
}

// discard is io.Discard that can start over.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func (discard) Seek(int64, int) (int64, error) { return 0, nil }

// backoff paces the attempts of one transfer: r.Retries of them, with
// pauses from r.RetryDelay doubling.
func (r *Repository) backoff() wait.Backoff {
	b := wait.Backoff{Duration: r.RetryDelay, Factor: 2, Steps: r.Retries}
	if b.Duration <= 0 {
		b.Duration = time.Second
	}
	if b.Steps <= 0 {
		b.Steps = 3
	}
	return b
}
