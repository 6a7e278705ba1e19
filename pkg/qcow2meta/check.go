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

package qcow2meta

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

const (
	// offsetMask selects the host offset of an L1, L2 or bitmap table
	// entry; refcountBlockMask that of a refcount table entry.
	offsetMask        = 0x00fffffffffffe00
	refcountBlockMask = ^uint64(511)
	flagCopied        = uint64(1) << 63
	flagCompressed    = uint64(1) << 62
	// maxMessages bounds the problems a CheckResult lists.
	maxMessages = 20

	// Check counts the references to each host cluster in chunks of
	// chunkClusters counters, allocated when a reference first lands in
	// the chunk: its memory follows the clusters the image uses, not the
	// length of the file, which may be a block device or a sparse file
	// much longer than the image.
	chunkClusters = 4096
	// maxChunks caps the counters at 256 MiB: 64 Mi clusters in use, 4 TiB
	// of 64 KiB clusters. Check refuses an image that needs more.
	maxChunks = 1 << 14
	// tablePiece is the most of a table Check reads at once.
	tablePiece = 64 << 10
)

// A counter holds the number of references to a cluster and, for entries
// whose COPIED flag must say whether the refcount is 1, whether one had the
// flag and one lacked it.
const (
	refCountMask = 1<<30 - 1
	refCopied    = 1 << 30
	refNotCopied = 1 << 31
)

// errTooLarge: counting the references would take more memory than
// Check allows itself.
var errTooLarge = errors.New("image too large to check")

// CheckResult is what Check found, in qemu-img check's terms: a cluster
// whose refcount is lower than its references is a corruption, higher a
// leak.
type CheckResult struct {
	Corruptions int
	Leaks       int
	// Dirty: the image was not closed cleanly with lazy refcounts.
	Dirty bool
	// MarkedCorrupt: QEMU set the corrupt bit.
	MarkedCorrupt bool
	// ImageEndOffset is the end of the last cluster the image uses.
	ImageEndOffset int64
	// Problems describes the first problems found.
	Problems []string
}

// Clean reports whether the metadata is consistent, as `qemu-img check`
// reports it: a dirty image whose refcounts happen to be right is clean
// (QEMU rebuilds them on open anyway), one marked corrupt is not.
func (r *CheckResult) Clean() bool {
	return r.Corruptions == 0 && r.Leaks == 0 && !r.MarkedCorrupt
}

func (r *CheckResult) String() string {
	s := fmt.Sprintf("%d corruptions, %d leaks", r.Corruptions, r.Leaks)
	if r.Dirty {
		s += ", dirty"
	}
	if r.MarkedCorrupt {
		s += ", marked corrupt"
	}
	for _, p := range r.Problems {
		s += "; " + p
	}
	return s
}

func (r *CheckResult) corruption(format string, args ...any) {
	r.Corruptions++
	r.note(format, args...)
}

func (r *CheckResult) note(format string, args ...any) {
	if len(r.Problems) < maxMessages {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Check verifies the metadata of the qcow2 image at path the way
// `qemu-img check` does: it counts the references to every cluster from
// the header, the L1 and L2 tables, the refcount structures and the
// persistent bitmaps, and compares them with the stored refcounts and the
// COPIED flags. A damaged image is not an error of Check: it returns a
// result that is not Clean. Images with internal snapshots or an external
// data file are refused.
//
// Its memory follows the clusters the image uses, not the length of the
// file, which may be a block device or a sparse file much longer than the
// image: references are counted in chunks allocated as they arrive, and
// tables are read in pieces. The tables are those of a header within
// QEMU's limits, and a table that two entries name is walked once. An
// image whose references need more than 256 MiB of counters is refused.
func Check(ctx context.Context, path string) (*CheckResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	res, err := check(ctx, f, size)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	return res, nil
}

// check checks the image in r, a file of size bytes.
func check(ctx context.Context, r io.ReaderAt, size int64) (*CheckResult, error) {
	c, err := newChecker(ctx, r, size)
	if err != nil {
		return nil, err
	}
	if err := c.run(); err != nil {
		return nil, err
	}
	return c.res, nil
}

func newChecker(ctx context.Context, r io.ReaderAt, size int64) (*checker, error) {
	h, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	cs := h.ClusterSize()
	return &checker{
		ctx:      ctx,
		r:        r,
		h:        h,
		cs:       cs,
		clusters: (uint64(size) + cs - 1) / cs,
		refs:     refCounts{chunks: map[uint64]*[chunkClusters]uint32{}, limit: maxChunks},
		res:      &CheckResult{},
		outer:    make([]byte, tablePiece),
		inner:    make([]byte, tablePiece),
	}, nil
}

type checker struct {
	ctx context.Context
	r   io.ReaderAt
	h   *Header
	cs  uint64
	// clusters is the number of clusters of the file, a partial last one
	// included.
	clusters uint64
	refs     refCounts
	res      *CheckResult
	// outer and inner hold the pieces of the tables being read: an L1
	// table (or the refcount table, or the bitmap directory) and the
	// L2 table (or bitmap table) it names.
	outer, inner []byte
}

// refCounts counts the references to the clusters of a file, in chunks
// allocated as references arrive.
type refCounts struct {
	chunks map[uint64]*[chunkClusters]uint32
	// limit is the most chunks allocated.
	limit int
}

// add counts a reference to cluster idx with the COPIED flags and returns
// the number of references counted before it.
func (r *refCounts) add(idx uint64, flags uint32) (uint32, error) {
	k := idx / chunkClusters
	chunk := r.chunks[k]
	if chunk == nil {
		if len(r.chunks) >= r.limit {
			return 0, fmt.Errorf("%w: its references need more than %d counters", errTooLarge, r.limit*chunkClusters)
		}
		chunk = new([chunkClusters]uint32)
		r.chunks[k] = chunk
	}
	v := &chunk[idx%chunkClusters]
	prev := *v & refCountMask
	if prev < refCountMask {
		*v++
	}
	*v |= flags
	return prev, nil
}

// siteKind is what holds a reference.
type siteKind int

const (
	siteHeader siteKind = iota
	siteL1Table
	siteL2Table
	siteDataCluster
	siteRefcountTable
	siteRefcountBlock
	siteBitmapDirectory
	siteBitmapTable
	siteBitmapData
)

// site names a reference in a problem; it is formatted only when a
// problem is reported.
type site struct {
	kind siteKind
	// i and j index the tables that hold the reference.
	i, j uint64
}

func (s site) String() string {
	switch s.kind {
	case siteHeader:
		return "header"
	case siteL1Table:
		return "L1 table"
	case siteL2Table:
		return fmt.Sprintf("L2 table of L1 entry %d", s.i)
	case siteDataCluster:
		return fmt.Sprintf("data cluster of L1 entry %d, L2 entry %d", s.i, s.j)
	case siteRefcountTable:
		return "refcount table"
	case siteRefcountBlock:
		return fmt.Sprintf("refcount block %d", s.i)
	case siteBitmapDirectory:
		return "bitmap directory"
	case siteBitmapTable:
		return fmt.Sprintf("bitmap %d table", s.i)
	default:
		return fmt.Sprintf("bitmap %d data", s.i)
	}
}

func (c *checker) run() error {
	h := c.h
	if h.NbSnapshots != 0 {
		return fmt.Errorf("images with internal snapshots are not supported (%d snapshots)", h.NbSnapshots)
	}
	if h.Incompatible&IncompatDataFile != 0 || h.DataFile != "" {
		return fmt.Errorf("images with an external data file are not supported")
	}
	c.res.Dirty = h.Dirty()
	c.res.MarkedCorrupt = h.Corrupt()

	if _, _, err := c.count(site{kind: siteHeader}, 0, c.cs, 0); err != nil {
		return err
	}
	if err := c.walkActiveTables(); err != nil {
		return err
	}
	if err := c.walkRefcountTable(); err != nil {
		return err
	}
	if h.Bitmaps != nil {
		if err := c.walkBitmaps(); err != nil {
			return err
		}
	}
	return c.compare()
}

// count counts a reference with the COPIED flags to every cluster of
// [offset, offset+length), which must start on a cluster boundary. It
// reports whether the range lies in the image, and whether its first
// cluster had no reference before.
func (c *checker) count(s site, offset, length uint64, flags uint32) (inImage, first bool, err error) {
	if offset%c.cs != 0 {
		c.res.corruption("%s at %#x is not cluster aligned", s, offset)
		return false, false, nil
	}
	return c.countBytes(s, offset, length, flags)
}

// countBytes is count for a range that may start inside a cluster, as
// compressed data does.
func (c *checker) countBytes(s site, offset, length uint64, flags uint32) (inImage, first bool, err error) {
	end := offset + length
	// A region may end in a partial last cluster of the file.
	if end < offset || end > c.clusters*c.cs {
		c.res.corruption("%s at %#x (%d bytes) lies beyond the end of the image", s, offset, length)
		return false, false, nil
	}
	if length == 0 {
		return true, true, nil
	}
	last := (end - 1) / c.cs
	for idx := offset / c.cs; idx <= last; idx++ {
		prev, err := c.refs.add(idx, flags)
		if err != nil {
			return false, false, err
		}
		if idx == offset/c.cs {
			first = prev == 0
		}
	}
	if end := int64((last + 1) * c.cs); end > c.res.ImageEndOffset {
		c.res.ImageEndOffset = end
	}
	return true, first, nil
}

// copiedFlags is what the COPIED flag of an entry says.
func copiedFlags(entry uint64) uint32 {
	if entry&flagCopied != 0 {
		return refCopied
	}
	return refNotCopied
}

// readAt fills buf from offset. Bytes past the end of the file read as
// zeroes, as QEMU reads them.
func (c *checker) readAt(s site, buf []byte, offset uint64) error {
	if err := readPadded(c.r, buf, int64(offset)); err != nil {
		return fmt.Errorf("read %s at %#x: %w", s, offset, err)
	}
	return nil
}

// forEntries calls fn with the index and the first 64 bits of each of the
// n entries, stride bytes apart, of the table at offset, read in pieces
// of buf.
func (c *checker) forEntries(s site, buf []byte, offset, n, stride uint64, fn func(i, entry uint64) error) error {
	per := uint64(len(buf)) / stride
	for first := uint64(0); first < n; first += per {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		piece := buf[:min(per, n-first)*stride]
		if err := c.readAt(s, piece, offset+first*stride); err != nil {
			return err
		}
		for x := uint64(0); x*stride < uint64(len(piece)); x++ {
			if err := fn(first+x, binary.BigEndian.Uint64(piece[x*stride:])); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *checker) walkActiveTables() error {
	h := c.h
	l1 := site{kind: siteL1Table}
	inImage, _, err := c.count(l1, h.L1TableOffset, uint64(h.L1Size)*8, 0)
	if err != nil || !inImage {
		return err
	}
	stride := h.l2EntrySize()
	return c.forEntries(l1, c.outer, h.L1TableOffset, uint64(h.L1Size), 8, func(i, e uint64) error {
		offset := e & offsetMask
		if offset == 0 {
			return nil
		}
		l2 := site{kind: siteL2Table, i: i}
		inImage, first, err := c.count(l2, offset, c.cs, copiedFlags(e))
		if err != nil || !inImage {
			return err
		}
		// Without internal snapshots, no two L1 entries share an L2
		// table: a table is walked at its first reference only, so that
		// an L1 table naming one table a million times costs one walk.
		if !first {
			c.res.corruption("%s at %#x is already in use", l2, offset)
			return nil
		}
		return c.forEntries(l2, c.inner, offset, c.cs/stride, stride, func(j, d uint64) error {
			return c.walkDataCluster(site{kind: siteDataCluster, i: i, j: j}, d)
		})
	})
}

func (c *checker) walkDataCluster(s site, d uint64) error {
	if d&flagCompressed != 0 {
		if d&flagCopied != 0 {
			c.res.corruption("%s: compressed cluster has the COPIED flag", s)
		}
		x := 62 - (c.h.ClusterBits - 8)
		host := d & (uint64(1)<<x - 1)
		sectors := (d >> x) & (uint64(1)<<(c.h.ClusterBits-8) - 1)
		_, _, err := c.countBytes(s, host, (sectors+1)*512-host%512, 0)
		return err
	}
	offset := d & offsetMask
	if offset == 0 {
		return nil
	}
	_, _, err := c.count(s, offset, c.cs, copiedFlags(d))
	return err
}

func (c *checker) walkRefcountTable() error {
	h := c.h
	table := site{kind: siteRefcountTable}
	length := uint64(h.RefcountTableClusters) * c.cs
	inImage, _, err := c.count(table, h.RefcountTableOffset, length, 0)
	if err != nil {
		return err
	}
	if !inImage {
		return fmt.Errorf("refcount table at %#x lies beyond the end of the image", h.RefcountTableOffset)
	}
	return c.forEntries(table, c.outer, h.RefcountTableOffset, length/8, 8, func(i, e uint64) error {
		if block := e & refcountBlockMask; block != 0 {
			_, _, err := c.count(site{kind: siteRefcountBlock, i: i}, block, c.cs, 0)
			return err
		}
		return nil
	})
}

func (c *checker) walkBitmaps() error {
	b := c.h.Bitmaps
	dir := site{kind: siteBitmapDirectory}
	inImage, _, err := c.count(dir, b.DirectoryOffset, b.DirectorySize, 0)
	if err != nil || !inImage {
		return err
	}
	be := binary.BigEndian
	maxTableSize := maxBitmapDataBytes / c.cs
	var entry [24]byte
	off := uint64(0)
	for n := uint64(0); n < uint64(b.Count); n++ {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if off+uint64(len(entry)) > b.DirectorySize {
			c.res.corruption("bitmap directory ends before entry %d", n)
			return nil
		}
		if err := c.readAt(dir, entry[:], b.DirectoryOffset+off); err != nil {
			return err
		}
		tableOffset := be.Uint64(entry[0:])
		tableSize := uint64(be.Uint32(entry[8:]))
		nameSize := uint64(be.Uint16(entry[18:]))
		extra := uint64(be.Uint32(entry[20:]))
		off += (uint64(len(entry)) + extra + nameSize + 7) &^ 7

		table := site{kind: siteBitmapTable, i: n}
		if tableSize > maxTableSize {
			c.res.corruption("%s of %d entries exceeds QEMU's limit of %d", table, tableSize, maxTableSize)
			continue
		}
		inImage, first, err := c.count(table, tableOffset, tableSize*8, 0)
		if err != nil {
			return err
		}
		if !inImage || tableSize == 0 {
			continue
		}
		if !first {
			c.res.corruption("%s at %#x is already in use", table, tableOffset)
			continue
		}
		data := site{kind: siteBitmapData, i: n}
		err = c.forEntries(table, c.inner, tableOffset, tableSize, 8, func(_, e uint64) error {
			if d := e & offsetMask; d != 0 {
				_, _, err := c.count(data, d, c.cs, 0)
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// compare compares the references counted with the refcounts stored for
// every cluster of the file, one refcount block at a time. As in qemu-img
// check, refcounts of clusters past the end of the file are not looked at.
func (c *checker) compare() error {
	h := c.h
	bits := uint64(1) << h.RefcountOrder
	perBlock := c.cs * 8 / bits
	keys := slices.Sorted(maps.Keys(c.refs.chunks))
	entries := min(uint64(h.RefcountTableClusters)*c.cs/8, (c.clusters+perBlock-1)/perBlock)
	block := make([]byte, c.cs)
	table := site{kind: siteRefcountTable}
	err := c.forEntries(table, c.outer, h.RefcountTableOffset, entries, 8, func(t, e uint64) error {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		start := t * perBlock
		end := min(start+perBlock, c.clusters)
		offset := e & refcountBlockMask
		if offset == 0 || offset%c.cs != 0 || offset/c.cs >= c.clusters {
			// No refcounts, or none that can be read: walkRefcountTable
			// reported why.
			c.compareUnstored(keys, start, end)
			return nil
		}
		if err := c.readAt(site{kind: siteRefcountBlock, i: t}, block, offset); err != nil {
			return err
		}
		c.compareBlock(block, bits, start, end)
		return nil
	})
	if err != nil {
		return err
	}
	c.compareUnstored(keys, min(entries*perBlock, c.clusters), c.clusters)
	return nil
}

// compareBlock compares the refcounts in block, those of the clusters from
// start, with the references to clusters [start, end).
func (c *checker) compareBlock(block []byte, bits, start, end uint64) {
	for from := start; from < end; {
		k := from / chunkClusters
		to := min((k+1)*chunkClusters, end)
		chunk := c.refs.chunks[k]
		if chunk == nil && allZero(block[(from-start)*bits/8:((to-start)*bits+7)/8]) {
			from = to
			continue
		}
		for idx := from; idx < to; idx++ {
			var n uint32
			if chunk != nil {
				n = chunk[idx%chunkClusters]
			}
			if stored := refcountAt(block, bits, idx-start); stored != 0 || n != 0 {
				c.compareCluster(idx, stored, n)
			}
		}
		from = to
	}
}

// compareUnstored compares the references to clusters [start, end), which
// have no stored refcount, with 0. keys are the chunks counted, in order.
func (c *checker) compareUnstored(keys []uint64, start, end uint64) {
	if start >= end {
		return
	}
	i, _ := slices.BinarySearch(keys, start/chunkClusters)
	for ; i < len(keys) && keys[i] <= (end-1)/chunkClusters; i++ {
		k := keys[i]
		chunk := c.refs.chunks[k]
		for idx := max(start, k*chunkClusters); idx < min(end, (k+1)*chunkClusters); idx++ {
			if n := chunk[idx%chunkClusters]; n != 0 {
				c.compareCluster(idx, 0, n)
			}
		}
	}
}

// compareCluster compares the refcount stored for cluster idx with the
// references counted to it.
func (c *checker) compareCluster(idx, stored uint64, n uint32) {
	want := uint64(n & refCountMask)
	switch {
	case want == refCountMask:
		c.res.corruption("cluster %d has at least %d references", idx, want)
	case stored < want:
		c.res.corruption("cluster %d refcount=%d reference=%d", idx, stored, want)
	case stored > want:
		c.res.Leaks++
		c.res.note("leaked cluster %d refcount=%d reference=%d", idx, stored, want)
	}
	if n&refCopied != 0 && stored != 1 {
		c.res.corruption("cluster %d: COPIED flag set with refcount %d", idx, stored)
	}
	if n&refNotCopied != 0 && stored == 1 {
		c.res.corruption("cluster %d: COPIED flag clear with refcount 1", idx)
	}
}

// refcountAt is the refcount of the i-th cluster a refcount block covers.
func refcountAt(block []byte, bits, i uint64) uint64 {
	be := binary.BigEndian
	switch bits {
	case 64:
		return be.Uint64(block[i*8:])
	case 32:
		return uint64(be.Uint32(block[i*4:]))
	case 16:
		return uint64(be.Uint16(block[i*2:]))
	case 8:
		return uint64(block[i])
	default:
		bit := i * bits
		return uint64(block[bit/8]>>(bit%8)) & (1<<bits - 1)
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
