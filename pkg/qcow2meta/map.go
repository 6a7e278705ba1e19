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
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// flagZero marks an L2 entry whose cluster reads as zeroes (version 3).
const flagZero = uint64(1)

// Extent maps Length bytes of the guest's disk from Guest to the image's
// bytes from Host, or, when Host is 0, to zeroes: offset 0 is the header's,
// never data's.
type Extent struct {
	Guest, Host, Length int64
}

// Zero reports whether the extent reads as zeroes.
func (e Extent) Zero() bool { return e.Host == 0 }

// Map is what an image holds of its guest's disk.
type Map struct {
	Header *Header
	// Extents are the guest ranges the image holds, data or zeroes, in
	// guest order, adjacent ones merged, none past the virtual size.
	// What they leave out the backing file holds or, without one, reads
	// as zeroes.
	Extents []Extent
}

// ErrTooManyExtents says an image's map needs more extents than the
// caller allows.
var ErrTooManyExtents = errors.New("too many extents")

// ReadMap reads which guest ranges the qcow2 image in r, a file of size
// bytes, holds and where, from its header and its L1 and L2 tables: a read
// of the header's first bytes, one of its first cluster, the L1 table in
// pieces and one read of each L2 table. A reader that fetches every read
// from afar (an object store) makes few reads.
//
// It refuses what it does not map or what QEMU would not read as it maps
// it: encryption, an external data file, extended L2 entries, internal
// snapshots, an image QEMU marked corrupt, compressed clusters, zero
// clusters in a version 2 image, a table or data cluster that is not
// cluster aligned or lies past the end of the file, and host clusters used
// twice: by two guest clusters, or by data and the header, L1 table,
// refcount table or an L2 table.
//
// maxExtents caps the extents and L2 tables it keeps: an image that needs
// more fails with ErrTooManyExtents.
func ReadMap(ctx context.Context, r io.ReaderAt, size int64, maxExtents int) (*Map, error) {
	h, err := readMapHeader(r, size)
	if err != nil {
		return nil, err
	}
	switch {
	case h.Incompatible&IncompatDataFile != 0 || h.DataFile != "":
		return nil, fmt.Errorf("images with an external data file are not supported")
	case h.ExtendedL2():
		return nil, fmt.Errorf("images with extended L2 entries (subclusters) are not supported")
	case h.NbSnapshots != 0:
		return nil, fmt.Errorf("images with internal snapshots are not supported (%d snapshots)", h.NbSnapshots)
	case h.Corrupt():
		return nil, fmt.Errorf("QEMU marked the image corrupt")
	}
	m := &mapper{ctx: ctx, r: r, h: h, cs: int64(h.ClusterSize()), size: size, vsize: int64(h.Size), max: maxExtents}
	// The header cluster, the L1 table and the refcount table are
	// metadata no data cluster may share.
	m.meta = append(m.meta,
		hostSpan{0, m.cs},
		hostSpan{int64(h.L1TableOffset), int64(h.L1TableOffset) + (int64(h.L1Size)*8+m.cs-1)/m.cs*m.cs},
		hostSpan{int64(h.RefcountTableOffset), int64(h.RefcountTableOffset) + int64(h.RefcountTableClusters)*m.cs})
	if err := m.walk(); err != nil {
		return nil, err
	}
	if err := m.checkHostSpans(); err != nil {
		return nil, err
	}
	return &Map{Header: h, Extents: m.extents}, nil
}

// readMapHeader reads the header from the image's first cluster, which
// holds it with its extensions and backing file name.
func readMapHeader(r io.ReaderAt, size int64) (*Header, error) {
	var start [24]byte // up to the cluster bits
	if err := readPadded(r, start[:], 0); err != nil {
		return nil, fmt.Errorf("read the header: %w", err)
	}
	bits := binary.BigEndian.Uint32(start[20:])
	if binary.BigEndian.Uint32(start[:]) != magic {
		return nil, ErrNotQcow2
	}
	if bits < minClusterBits || bits > maxClusterBits {
		return nil, fmt.Errorf("invalid cluster bits %d", bits)
	}
	first := make([]byte, min(int64(1)<<bits, max(size, 0)))
	if err := readPadded(r, first, 0); err != nil {
		return nil, fmt.Errorf("read the header: %w", err)
	}
	return readHeader(zeroPadded(first))
}

// readPadded fills buf from offset; bytes past the end of the file read as
// zeroes, as QEMU reads them.
func readPadded(r io.ReaderAt, buf []byte, offset int64) error {
	n, err := r.ReadAt(buf, offset)
	if n == len(buf) {
		return nil
	}
	if errors.Is(err, io.EOF) {
		clear(buf[n:])
		return nil
	}
	return err
}

// zeroPadded reads as its bytes followed by zeroes.
type zeroPadded []byte

func (z zeroPadded) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	n := 0
	if off < int64(len(z)) {
		n = copy(p, z[off:])
	}
	clear(p[n:])
	return len(p), nil
}

// hostSpan is a range of the image file, [start, end).
type hostSpan struct {
	start, end int64
}

type mapper struct {
	ctx context.Context
	r   io.ReaderAt
	h   *Header
	// cs is the cluster size, size the file's, vsize the guest's.
	cs, size, vsize int64
	max             int
	extents         []Extent
	// meta are the metadata ranges of the file: header, L1, refcount
	// and L2 tables; tables counts the L2 tables.
	meta   []hostSpan
	tables int
}

// walk reads the L1 table in pieces, and the L2 table of each of its
// entries that map the virtual size.
func (m *mapper) walk() error {
	perTable := m.cs / 8
	perL1Entry := perTable * m.cs
	entries := (m.vsize + perL1Entry - 1) / perL1Entry
	piece := make([]byte, min(entries*8, tablePiece))
	l2 := make([]byte, m.cs)
	for first := int64(0); first < entries; first += int64(len(piece)) / 8 {
		n := min(int64(len(piece))/8, entries-first)
		if err := m.readTable("L1 table", piece[:n*8], int64(m.h.L1TableOffset)+first*8); err != nil {
			return err
		}
		for x := range n {
			if err := m.ctx.Err(); err != nil {
				return err
			}
			i := first + x
			offset := int64(binary.BigEndian.Uint64(piece[x*8:]) & offsetMask)
			if offset == 0 {
				continue
			}
			if offset%m.cs != 0 {
				return fmt.Errorf("L2 table of L1 entry %d at %#x is not cluster aligned", i, offset)
			}
			if err := m.readTable(fmt.Sprintf("L2 table of L1 entry %d", i), l2, offset); err != nil {
				return err
			}
			if err := m.grow(); err != nil {
				return err
			}
			m.tables++
			m.meta = append(m.meta, hostSpan{offset, offset + m.cs})
			for j := range perTable {
				guest := i*perL1Entry + j*m.cs
				if guest >= m.vsize {
					break
				}
				if err := m.entry(guest, binary.BigEndian.Uint64(l2[j*8:])); err != nil {
					return fmt.Errorf("L1 entry %d, L2 entry %d: %w", i, j, err)
				}
			}
		}
	}
	return nil
}

// readTable reads a table, or a piece of one, that must lie in the file.
func (m *mapper) readTable(what string, buf []byte, offset int64) error {
	if offset < 0 || offset > m.size-int64(len(buf)) {
		return fmt.Errorf("%s at %#x lies past the end of the image (%d bytes)", what, offset, m.size)
	}
	if err := readPadded(m.r, buf, offset); err != nil {
		return fmt.Errorf("read %s at %#x: %w", what, offset, err)
	}
	return nil
}

// entry maps the guest cluster at guest as L2 entry d says.
func (m *mapper) entry(guest int64, d uint64) error {
	length := min(m.cs, m.vsize-guest)
	host := int64(d & offsetMask)
	switch {
	case d&flagCompressed != 0:
		return fmt.Errorf("compressed clusters are not supported")
	case d&flagZero != 0:
		if m.h.Version < 3 {
			return fmt.Errorf("zero cluster in a version %d image", m.h.Version)
		}
		host = 0
	case host == 0:
		return nil // the backing file's
	case host%m.cs != 0:
		return fmt.Errorf("data cluster at %#x is not cluster aligned", host)
	case host > m.size-length:
		return fmt.Errorf("data cluster at %#x lies past the end of the image (%d bytes)", host, m.size)
	}
	if n := len(m.extents); n > 0 {
		last := &m.extents[n-1]
		if last.Guest+last.Length == guest && (last.Zero() && host == 0 || !last.Zero() && last.Host+last.Length == host) {
			last.Length += length
			return nil
		}
	}
	if err := m.grow(); err != nil {
		return err
	}
	m.extents = append(m.extents, Extent{Guest: guest, Host: host, Length: length})
	return nil
}

// grow makes room for one more extent or L2 table, within the cap.
func (m *mapper) grow() error {
	if m.tables+len(m.extents) >= m.max {
		return fmt.Errorf("%w: more than %d extents and L2 tables", ErrTooManyExtents, m.max)
	}
	return nil
}

// checkHostSpans refuses data clusters that overlap each other or the
// metadata, and metadata that overlaps itself: a guest cluster reads what
// QEMU wrote for it alone.
func (m *mapper) checkHostSpans() error {
	spans := m.meta
	for _, e := range m.extents {
		if !e.Zero() {
			// A partial last cluster still takes a whole one.
			spans = append(spans, hostSpan{e.Host, e.Host + (e.Length+m.cs-1)/m.cs*m.cs})
		}
	}
	slices.SortFunc(spans, func(a, b hostSpan) int { return cmp.Compare(a.start, b.start) })
	for i := 1; i < len(spans); i++ {
		if prev := spans[i-1]; spans[i].start < prev.end {
			return fmt.Errorf("host clusters used twice: %#x-%#x and %#x-%#x overlap", prev.start, prev.end, spans[i].start, spans[i].end)
		}
	}
	return nil
}
