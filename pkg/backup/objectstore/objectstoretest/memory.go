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

// Package objectstoretest holds an in-memory Store for unit tests, with the
// conditional-write semantics of S3 and hooks to inject failures.
package objectstoretest

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

type object struct {
	data     []byte
	etag     string
	modified time.Time
	// sha256 is what its writer recorded (PutOptions.SHA256).
	sha256 string
}

// Memory is a Store in memory.
type Memory struct {
	mu      sync.Mutex
	objects map[string]object
	// Now stamps objects; nil means time.Now.
	Now func() time.Time
	// BreakReadsAfter, when positive, makes every Get's reader fail after
	// that many bytes (a dropped connection), once per Get.
	BreakReadsAfter int64
	// BrokenReads counts the reads broken so far; breaking stops
	// breaking once it reaches MaxBrokenReads (zero means no limit).
	BrokenReads    int
	MaxBrokenReads int
	// Tear, when set, gives the bytes a Get of the whole object delivers in
	// place of the object's, while the ObjectInfo still describes the
	// object: a store that tears a read.
	Tear func(key string, data []byte) []byte
	// TearRanges does what Tear does for a Get of a range, the bytes of
	// the object from offset.
	TearRanges func(key string, offset int64, data []byte) []byte
	// SlowReads, when positive, makes every read of a Get's reader take
	// that long: a transfer that lasts.
	SlowReads time.Duration
	// NoChecksums makes Get report no checksum of the store's own, as
	// stores that keep none.
	NoChecksums bool
}

// NewMemory returns an empty store.
func NewMemory() *Memory { return &Memory{objects: map[string]object{}} }

var _ objectstore.Store = (*Memory)(nil)

func (m *Memory) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Get implements objectstore.Store.
func (m *Memory) Get(_ context.Context, key string, offset, length int64) (io.ReadCloser, objectstore.ObjectInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok {
		return nil, objectstore.ObjectInfo{}, fmt.Errorf("get %s: %w", key, objectstore.ErrNotFound)
	}
	whole := offset == 0 && length <= 0
	data := o.data
	if m.Tear != nil && whole {
		data = m.Tear(key, append([]byte(nil), data...))
	}
	data = data[min(offset, int64(len(data))):]
	if length > 0 && length < int64(len(data)) {
		data = data[:length]
	}
	if m.TearRanges != nil && !whole {
		data = m.TearRanges(key, offset, append([]byte(nil), data...))
	}
	var r io.Reader = bytes.NewReader(data)
	if m.BreakReadsAfter > 0 && (m.MaxBrokenReads == 0 || m.BrokenReads < m.MaxBrokenReads) &&
		int64(len(data)) > m.BreakReadsAfter {
		m.BrokenReads++
		r = io.MultiReader(io.LimitReader(r, m.BreakReadsAfter), errReader{})
	}
	if m.SlowReads > 0 {
		r = slowReader{r, m.SlowReads}
	}
	info := m.info(key, o)
	if whole {
		// As S3 reports a checksum and the user metadata on a whole
		// read.
		if !m.NoChecksums {
			info.Checksum, _ = objectstore.ChecksumOf("SHA256", o.data)
		}
		info.SHA256 = o.sha256
	}
	return io.NopCloser(r), info, nil
}

type slowReader struct {
	r     io.Reader
	delay time.Duration
}

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.delay)
	return s.r.Read(p)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, fmt.Errorf("connection reset (injected)") }

// Stat implements objectstore.Store.
func (m *Memory) Stat(_ context.Context, key string) (objectstore.ObjectInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.objects[key]
	if !ok {
		return objectstore.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, objectstore.ErrNotFound)
	}
	return m.info(key, o), nil
}

// Put implements objectstore.Store.
func (m *Memory) Put(_ context.Context, key string, r io.Reader, _ int64, opts objectstore.PutOptions) (objectstore.ObjectInfo, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return objectstore.ObjectInfo{}, fmt.Errorf("put %s: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, exists := m.objects[key]
	if opts.Condition.IfNoneMatch && exists {
		return objectstore.ObjectInfo{}, fmt.Errorf("put %s: %w", key, objectstore.ErrPreconditionFailed)
	}
	if opts.Condition.IfMatch != "" {
		if !exists {
			return objectstore.ObjectInfo{}, fmt.Errorf("put %s: %w", key, objectstore.ErrNotFound)
		}
		if cur.etag != opts.Condition.IfMatch {
			return objectstore.ObjectInfo{}, fmt.Errorf("put %s: %w", key, objectstore.ErrPreconditionFailed)
		}
	}
	sum := md5.Sum(data)
	o := object{data: data, etag: hex.EncodeToString(sum[:]), modified: m.now(), sha256: opts.SHA256}
	m.objects[key] = o
	return m.info(key, o), nil
}

// Delete implements objectstore.Store.
func (m *Memory) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects, key)
	return nil
}

// List implements objectstore.Store.
func (m *Memory) List(_ context.Context, prefix string) ([]objectstore.ObjectInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []objectstore.ObjectInfo
	for k, o := range m.objects {
		if strings.HasPrefix(k, prefix) {
			out = append(out, m.info(k, o))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Keys lists every key.
func (m *Memory) Keys() []string {
	objs, _ := m.List(context.Background(), "")
	keys := make([]string, len(objs))
	for i, o := range objs {
		keys[i] = o.Key
	}
	return keys
}

// Tamper replaces an object's bytes behind the catalog's back, keeping or
// changing its size.
func (m *Memory) Tamper(key string, fn func([]byte) []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.objects[key]
	o.data = fn(append([]byte(nil), o.data...))
	sum := md5.Sum(o.data)
	o.etag = hex.EncodeToString(sum[:])
	m.objects[key] = o
}

func (m *Memory) info(key string, o object) objectstore.ObjectInfo {
	return objectstore.ObjectInfo{Key: key, Size: int64(len(o.data)), ETag: o.etag, LastModified: o.modified}
}
