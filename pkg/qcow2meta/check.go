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
	"fmt"
	"io"
	"os"
)

const (
	offsetMask     = 0x00fffffffffffe00
	flagCopied     = uint64(1) << 63
	flagCompressed = uint64(1) << 62
	// maxMessages bounds the problems a CheckResult lists.
	maxMessages = 20
)

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
	h, err := readHeader(f)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	c := &checker{ctx: ctx, r: f, h: h, cs: h.ClusterSize(), res: &CheckResult{}}
	c.clusters = (uint64(size) + c.cs - 1) / c.cs
	c.refs = make([]uint32, c.clusters)
	if err := c.run(); err != nil {
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	return c.res, nil
}

type checker struct {
	ctx      context.Context
	r        io.ReaderAt
	h        *Header
	cs       uint64
	clusters uint64
	// refs counts the references found to every cluster of the file.
	refs []uint32
	res  *CheckResult
	// refcountTable is the stored refcount table.
	refcountTable []uint64
	// copied lists the entries whose COPIED flag must match a refcount of 1.
	copied []copiedFlag
}

type copiedFlag struct {
	what   string
	offset uint64
	set    bool
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

	c.refRange("header", 0, c.cs)
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

// ref counts one reference to the cluster at offset.
func (c *checker) ref(what string, offset uint64) {
	if offset%c.cs != 0 {
		c.res.corruption("%s at %#x is not cluster aligned", what, offset)
		return
	}
	c.refIndex(what, offset/c.cs)
}

func (c *checker) refIndex(what string, idx uint64) {
	if idx >= c.clusters {
		c.res.corruption("%s in cluster %d lies beyond the end of the image", what, idx)
		return
	}
	c.refs[idx]++
	if end := int64((idx + 1) * c.cs); end > c.res.ImageEndOffset {
		c.res.ImageEndOffset = end
	}
}

// refRange counts one reference to every cluster of [offset, offset+length).
func (c *checker) refRange(what string, offset, length uint64) {
	if length == 0 {
		return
	}
	if offset%c.cs != 0 {
		c.res.corruption("%s at %#x is not cluster aligned", what, offset)
		return
	}
	for idx := offset / c.cs; idx <= (offset+length-1)/c.cs; idx++ {
		c.refIndex(what, idx)
	}
}

// readTable reads n big-endian 64-bit entries at offset, stride bytes apart.
func (c *checker) readTable(what string, offset, n, stride uint64) ([]uint64, error) {
	if n > 1<<28 {
		return nil, fmt.Errorf("%s of %d entries is implausibly large", what, n)
	}
	buf := make([]byte, n*stride)
	if _, err := c.r.ReadAt(buf, int64(offset)); err != nil {
		return nil, fmt.Errorf("read %s at %#x: %w", what, offset, err)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.BigEndian.Uint64(buf[uint64(i)*stride:])
	}
	return out, nil
}

func (c *checker) inFile(offset, length uint64) bool {
	return offset+length <= c.clusters*c.cs && offset+length >= offset
}

func (c *checker) walkActiveTables() error {
	h := c.h
	l1Bytes := uint64(h.L1Size) * 8
	c.refRange("L1 table", h.L1TableOffset, l1Bytes)
	if h.L1Size == 0 {
		return nil
	}
	if !c.inFile(h.L1TableOffset, l1Bytes) {
		c.res.corruption("L1 table at %#x lies beyond the end of the image", h.L1TableOffset)
		return nil
	}
	l1, err := c.readTable("L1 table", h.L1TableOffset, uint64(h.L1Size), 8)
	if err != nil {
		return err
	}
	stride := h.l2EntrySize()
	for i, e := range l1 {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		l2 := e & offsetMask
		if l2 == 0 {
			continue
		}
		what := fmt.Sprintf("L2 table of L1 entry %d", i)
		c.ref(what, l2)
		c.copied = append(c.copied, copiedFlag{what: what, offset: l2, set: e&flagCopied != 0})
		if l2%c.cs != 0 || !c.inFile(l2, c.cs) {
			continue
		}
		entries, err := c.readTable(what, l2, c.cs/stride, stride)
		if err != nil {
			return err
		}
		for j, d := range entries {
			c.walkDataCluster(fmt.Sprintf("data cluster of L1 entry %d, L2 entry %d", i, j), d)
		}
	}
	return nil
}

func (c *checker) walkDataCluster(what string, d uint64) {
	if d&flagCompressed != 0 {
		if d&flagCopied != 0 {
			c.res.corruption("%s: compressed cluster has the COPIED flag", what)
		}
		x := 62 - (c.h.ClusterBits - 8)
		host := d & (uint64(1)<<x - 1)
		sectors := (d >> x) & (uint64(1)<<(62-x) - 1)
		end := host&^511 + (sectors+1)*512
		for idx := host / c.cs; idx <= (end-1)/c.cs; idx++ {
			c.refIndex(what, idx)
		}
		return
	}
	off := d & offsetMask
	if off == 0 {
		return
	}
	c.ref(what, off)
	c.copied = append(c.copied, copiedFlag{what: what, offset: off, set: d&flagCopied != 0})
}

func (c *checker) walkRefcountTable() error {
	h := c.h
	length := uint64(h.RefcountTableClusters) * c.cs
	c.refRange("refcount table", h.RefcountTableOffset, length)
	if !c.inFile(h.RefcountTableOffset, length) {
		return fmt.Errorf("refcount table at %#x lies beyond the end of the image", h.RefcountTableOffset)
	}
	table, err := c.readTable("refcount table", h.RefcountTableOffset, length/8, 8)
	if err != nil {
		return err
	}
	for i, e := range table {
		block := e &^ 511
		if block == 0 {
			continue
		}
		c.ref(fmt.Sprintf("refcount block %d", i), block)
	}
	c.refcountTable = table
	return nil
}

func (c *checker) walkBitmaps() error {
	b := c.h.Bitmaps
	c.refRange("bitmap directory", b.DirectoryOffset, b.DirectorySize)
	if b.DirectorySize > 64<<20 || !c.inFile(b.DirectoryOffset, b.DirectorySize) {
		c.res.corruption("bitmap directory at %#x (%d bytes) is out of bounds", b.DirectoryOffset, b.DirectorySize)
		return nil
	}
	dir := make([]byte, b.DirectorySize)
	if _, err := c.r.ReadAt(dir, int64(b.DirectoryOffset)); err != nil {
		return fmt.Errorf("read bitmap directory: %w", err)
	}
	be := binary.BigEndian
	off := uint64(0)
	for n := uint32(0); n < b.Count; n++ {
		if off+24 > uint64(len(dir)) {
			c.res.corruption("bitmap directory ends before entry %d", n)
			return nil
		}
		tableOffset := be.Uint64(dir[off:])
		tableSize := uint64(be.Uint32(dir[off+8:]))
		nameSize := uint64(be.Uint16(dir[off+18:]))
		extra := uint64(be.Uint32(dir[off+20:]))
		what := fmt.Sprintf("bitmap %d table", n)
		c.refRange(what, tableOffset, tableSize*8)
		if tableSize > 0 && c.inFile(tableOffset, tableSize*8) {
			table, err := c.readTable(what, tableOffset, tableSize, 8)
			if err != nil {
				return err
			}
			for _, e := range table {
				if d := e & offsetMask; d != 0 {
					c.ref(fmt.Sprintf("bitmap %d data", n), d)
				}
			}
		}
		off += (24 + extra + nameSize + 7) &^ 7
	}
	return nil
}

// storedRefcount reads the refcount of cluster idx from the refcount
// structures.
func (c *checker) storedRefcount(idx uint64, blocks map[uint64][]byte) (uint64, error) {
	bits := uint64(1) << c.h.RefcountOrder
	perBlock := c.cs * 8 / bits
	t := idx / perBlock
	if t >= uint64(len(c.refcountTable)) {
		return 0, nil
	}
	block := c.refcountTable[t] &^ 511
	if block == 0 || block%c.cs != 0 || !c.inFile(block, c.cs) {
		return 0, nil
	}
	data, ok := blocks[block]
	if !ok {
		data = make([]byte, c.cs)
		if _, err := c.r.ReadAt(data, int64(block)); err != nil {
			return 0, fmt.Errorf("read refcount block at %#x: %w", block, err)
		}
		blocks[block] = data
	}
	i := idx % perBlock
	switch bits {
	case 64:
		return binary.BigEndian.Uint64(data[i*8:]), nil
	case 32:
		return uint64(binary.BigEndian.Uint32(data[i*4:])), nil
	case 16:
		return uint64(binary.BigEndian.Uint16(data[i*2:])), nil
	case 8:
		return uint64(data[i]), nil
	default:
		bitOff := i * bits
		return uint64(data[bitOff/8]>>(bitOff%8)) & (1<<bits - 1), nil
	}
}

func (c *checker) compare() error {
	blocks := map[uint64][]byte{}
	stored := make(map[uint64]uint64)
	for idx := uint64(0); idx < c.clusters; idx++ {
		if idx%4096 == 0 {
			if err := c.ctx.Err(); err != nil {
				return err
			}
		}
		refcount, err := c.storedRefcount(idx, blocks)
		if err != nil {
			return err
		}
		want := uint64(c.refs[idx])
		switch {
		case refcount < want:
			c.res.corruption("cluster %d refcount=%d reference=%d", idx, refcount, want)
		case refcount > want:
			c.res.Leaks++
			c.res.note("leaked cluster %d refcount=%d reference=%d", idx, refcount, want)
		}
		if want > 0 {
			stored[idx] = refcount
		}
	}
	for _, f := range c.copied {
		if f.offset%c.cs != 0 {
			continue
		}
		refcount, ok := stored[f.offset/c.cs]
		if !ok {
			continue
		}
		if f.set != (refcount == 1) {
			c.res.corruption("%s: COPIED flag %v with refcount %d", f.what, f.set, refcount)
		}
	}
	return nil
}
