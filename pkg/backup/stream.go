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
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/retry"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

// DefaultMaxRestoreExtents is how many ranges a streamed restore keeps
// when Repository.MaxRestoreExtents is zero: a few MiB of them (24 to 48
// bytes each), with room to spare in a 64 MiB pod. A chain needs one per run of contiguous
// clusters of a layer the guest reads, and one per metadata read: a few
// per GiB for a full backup QEMU wrote, one per changed run for an
// incremental.
const DefaultMaxRestoreExtents = 1 << 17

func (r *Repository) maxRestoreExtents() int {
	if r.MaxRestoreExtents > 0 {
		return r.MaxRestoreExtents
	}
	return DefaultMaxRestoreExtents
}

// streamLayer is one layer of a streamed restore: its object, the data
// extents the guest reads from it and the metadata ranges its map was
// read from.
type streamLayer struct {
	checkpoint string
	file       *catalog.FileEntry
	runs       []qcow2meta.Extent
	reads      []metaRead
}

// restoreStreamed writes the disk of chain, whose layers are files, base
// first, onto target in one pass over each layer, and returns its
// virtual size. A layer read otherwise than the index records it, or
// whose metadata changed between its map and its stream, starts the whole
// restore over, as often as r.backoff allows. A chain whose map needs more
// than r.maxRestoreExtents fails with qcow2meta.ErrTooManyExtents before
// the target is touched.
func (r *Repository) restoreStreamed(ctx context.Context, chain []catalog.CheckpointEntry, files []*catalog.FileEntry, target string, progress Progress) (int64, error) {
	attempts := r.backoff().Steps
	for attempt := 1; ; attempt++ {
		size, err := r.streamOnce(ctx, chain, files, target, progress)
		var bad *badRead
		if !errors.As(err, &bad) {
			return size, err
		}
		if attempt >= attempts {
			i := slices.IndexFunc(files, func(f *catalog.FileEntry) bool { return f.ObjectPath == bad.object })
			return 0, fmt.Errorf("checkpoint %s: %w", chain[i].ID,
				&ObjectError{Object: bad.object, Reason: fmt.Sprintf("%s (after %d attempts)", bad.reason, attempt)})
		}
	}
}

func (r *Repository) streamOnce(ctx context.Context, chain []catalog.CheckpointEntry, files []*catalog.FileEntry, target string, progress Progress) (int64, error) {
	layers, zero, size, err := r.planChain(ctx, chain, files)
	if err != nil {
		return 0, err
	}
	out, err := openTarget(target, size)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	if blockdev.Is(target) {
		for _, z := range zero {
			if err := blockdev.Zero(out, z.start, z.end-z.start); err != nil {
				return 0, err
			}
		}
	}
	for _, l := range layers {
		slices.SortFunc(l.runs, func(a, b qcow2meta.Extent) int { return cmp.Compare(a.Host, b.Host) })
		w := &layerWriter{key: l.file.ObjectPath, target: out, runs: l.runs, reads: l.reads}
		m := r.track(l.file.ObjectPath, l.file.Size, progress)
		err := r.downloadOnce(ctx, l.file.ObjectPath, w, l.file.Size, l.file.SHA256, m)
		m.Stop()
		if err == nil && w.stale != nil {
			err = w.stale
		}
		if err != nil {
			return 0, fmt.Errorf("checkpoint %s: %w", l.checkpoint, err)
		}
	}
	if err := out.Sync(); err != nil {
		return 0, fmt.Errorf("write %s: %w", target, err)
	}
	if err := out.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", target, err)
	}
	return size, nil
}

// planChain reads the map of every layer, top first, and decides which
// guest ranges each provides. It returns the layers base first, the
// ranges that read as zeroes and the disk's virtual size.
func (r *Repository) planChain(ctx context.Context, chain []catalog.CheckpointEntry, files []*catalog.FileEntry) ([]streamLayer, []span, int64, error) {
	limit := r.maxRestoreExtents()
	layers := make([]streamLayer, len(files))
	// The planner exists once the top layer, which sets the disk's
	// size, is read; until then it keeps nothing.
	p := &chainPlanner{}
	used := 0
	for i := len(files) - 1; i >= 0; i-- {
		f := files[i]
		rd := &rangeReader{ctx: ctx, r: r, key: f.ObjectPath, size: f.Size}
		m, err := qcow2meta.ReadMap(ctx, rd, f.Size, limit-used-p.spans())
		if err == nil {
			want := catalog.Incremental
			if i == 0 {
				want = catalog.Full
			}
			err = checkBacking(m.Header.BackingFile, want)
		}
		if err != nil {
			return nil, nil, 0, fmt.Errorf("checkpoint %s: %w", chain[i].ID, r.layerError(ctx, f, i, rd, err))
		}
		if i == len(files)-1 {
			p = newChainPlanner(int64(m.Header.Size))
		}
		layers[i] = streamLayer{checkpoint: chain[i].ID, file: f, runs: p.claim(m.Extents, int64(m.Header.Size)), reads: rd.sorted()}
		used += len(layers[i].runs) + len(layers[i].reads)
		if used+p.spans() > limit {
			return nil, nil, 0, fmt.Errorf("%w: the chain needs more than %d", qcow2meta.ErrTooManyExtents, limit)
		}
	}
	return layers, p.zeroes(), p.size, nil
}

// layerError says why layer i could not be mapped. The layer is read
// whole first: one whose bytes are not what the index records, or whose
// metadata are not those its map was read from, is a bad read to start
// over from; otherwise the image is what err says.
func (r *Repository) layerError(ctx context.Context, f *catalog.FileEntry, i int, rd *rangeReader, err error) error {
	if rd.err != nil {
		return rd.err
	}
	if errors.Is(err, qcow2meta.ErrTooManyExtents) || ctx.Err() != nil {
		return err
	}
	w := &layerWriter{key: f.ObjectPath, reads: rd.sorted()}
	m := r.track(f.ObjectPath, f.Size, nil)
	derr := r.downloadOnce(ctx, f.ObjectPath, w, f.Size, f.SHA256, m)
	m.Stop()
	switch {
	case derr != nil:
		return derr
	case w.stale != nil:
		return w.stale
	}
	return fmt.Errorf("layer %d (%s): %w", i, f.ObjectPath, err)
}

// openTarget opens the target of a restore of a disk of size bytes: a
// block device of at least that size, written in place, or a regular file
// created or emptied, of that size and sparse.
func openTarget(path string, size int64) (*os.File, error) {
	if blockdev.Is(path) {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		end, err := f.Seek(0, io.SeekEnd)
		if err == nil && end < size {
			err = fmt.Errorf("has %d bytes, the disk %d", end, size)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("block device %s: %w", path, err)
		}
		return f, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return f, nil
}

// metaRead is a range of a layer that its map was read from, and the
// digest of what was read.
type metaRead struct {
	offset, length int64
	sum            [sha256.Size]byte
}

// rangeReader reads an object of size bytes with ranged GETs, as
// qcow2meta.ReadMap reads an image, and keeps the digest of every range it
// read, so that the layer's stream can vouch for them.
type rangeReader struct {
	ctx   context.Context
	r     *Repository
	key   string
	size  int64
	reads []metaRead
	// err is the store's failure, which no error about the image should
	// hide.
	err error
}

// sorted returns the reads in offset order.
func (rd *rangeReader) sorted() []metaRead {
	slices.SortFunc(rd.reads, func(a, b metaRead) int { return cmp.Compare(a.offset, b.offset) })
	return rd.reads
}

func (rd *rangeReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= rd.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), rd.size-off)
	err := retry.OnError(rd.ctx, rd.r.backoff(), retriableRead, func() error {
		rc, err := rd.r.open(rd.ctx, rd.key, off, n, rd.size)
		if err != nil {
			return err
		}
		defer rc.Close()
		if _, err := io.ReadFull(rc, p[:n]); err != nil {
			return fmt.Errorf("read %s at %d: %w", rd.key, off, err)
		}
		return nil
	})
	if err != nil {
		rd.err = fmt.Errorf("download %s: %w", rd.key, err)
		return 0, rd.err
	}
	rd.reads = append(rd.reads, metaRead{offset: off, length: n, sum: sha256.Sum256(p[:n])})
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// layerWriter takes the bytes of a layer as they stream, in order, and
// writes those of each data extent the guest reads from the layer to the
// extent's guest offset in the target. It checks on the way that the
// metadata ranges the layer's map was read from hold the bytes read then:
// the digest of the whole layer then vouches for the map too. Once they
// do not, it writes nothing more and keeps the reason in stale; the
// layer's digest then tells whether the stream or the map was read
// wrong.
type layerWriter struct {
	key    string
	target *os.File
	// runs are in host order, reads in offset order.
	runs  []qcow2meta.Extent
	reads []metaRead
	// pos is the offset in the layer of the next byte; run and read
	// index the first run and read not passed yet, open the reads begun
	// and not ended.
	pos       int64
	run, read int
	open      []*metaCheck
	stale     *badRead
	// unflushed counts the bytes written since the target's write-back
	// was last started.
	unflushed int64
}

// flushEvery is how many bytes a restore writes before it starts the
// target's write-back: the final sync then finds little left to write,
// and the dirty pages of a large disk do not pile up in memory (the page
// cache counts against the pod's memory limit).
const flushEvery = 32 << 20

// metaCheck hashes the bytes of a metadata range as they pass.
type metaCheck struct {
	metaRead
	h hash.Hash
}

func (w *layerWriter) Write(p []byte) (int, error) {
	start, end := w.pos, w.pos+int64(len(p))
	if w.stale == nil {
		if err := w.write(p, start, end); err != nil {
			return 0, err
		}
		w.check(p, start, end)
	}
	w.pos = end
	return len(p), nil
}

// write writes what p, bytes [start, end) of the layer, holds of the runs.
func (w *layerWriter) write(p []byte, start, end int64) error {
	for ; w.run < len(w.runs) && w.runs[w.run].Host < end; w.run++ {
		e := w.runs[w.run]
		from, to := max(e.Host, start), min(e.Host+e.Length, end)
		if _, err := w.target.WriteAt(p[from-start:to-start], e.Guest+from-e.Host); err != nil {
			return err
		}
		w.unflushed += to - from
		if e.Host+e.Length > end {
			break
		}
	}
	if w.unflushed >= flushEvery {
		// Only a hint, like the kernel's own write-back: a write that
		// fails fails the sync at the end.
		_ = unix.SyncFileRange(int(w.target.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		w.unflushed = 0
	}
	return nil
}

// check hashes what p, bytes [start, end) of the layer, holds of the
// metadata reads, and compares those that end in p.
func (w *layerWriter) check(p []byte, start, end int64) {
	for ; w.read < len(w.reads) && w.reads[w.read].offset < end; w.read++ {
		w.open = append(w.open, &metaCheck{metaRead: w.reads[w.read], h: sha256.New()})
	}
	open := w.open[:0]
	for _, c := range w.open {
		from, to := max(c.offset, start), min(c.offset+c.length, end)
		c.h.Write(p[from-start : to-start])
		if c.offset+c.length > end {
			open = append(open, c)
			continue
		}
		if !bytes.Equal(c.h.Sum(nil), c.sum[:]) {
			w.stale = &badRead{object: w.key, reason: fmt.Sprintf("bytes %d-%d differ from those its map was read from: the object was altered", c.offset, c.offset+c.length)}
		}
	}
	w.open = open
}
