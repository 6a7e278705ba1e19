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

// Package qcow2meta reads, writes and checks qcow2 image metadata in Go, for
// processes that cannot run qemu-img: a hook sidecar image holds one static
// binary and nothing else. It covers what an overlay needs (an empty image
// over a backing file, its header, a consistency check of its metadata); the
// qemu-img wrapper in pkg/qcow2 remains the tool for everything else.
//
// The format is QEMU's docs/interop/qcow2.txt, version 3.
package qcow2meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

const (
	magic = 0x514649fb // "QFI\xfb"

	headerV2Length = 72
	headerV3Length = 104
	// headerLength is what this package writes: the version 3 header plus
	// the compression type byte, padded to a multiple of 8.
	headerLength = 112

	extEnd           = 0x00000000
	extBackingFormat = 0xe2792aca
	extBitmaps       = 0x23852875
	extDataFile      = 0x44415441

	knownIncompatible = IncompatDirty | IncompatCorrupt | IncompatDataFile | IncompatCompressed | IncompatExtendedL2

	// CompatLazyRefcounts is the compatible feature bit for lazy refcounts.
	CompatLazyRefcounts = 1 << 0

	// AutoclearBitmaps marks the bitmaps extension consistent.
	AutoclearBitmaps = 1 << 0
)

// Incompatible feature bits.
const (
	IncompatDirty      = 1 << 0
	IncompatCorrupt    = 1 << 1
	IncompatDataFile   = 1 << 2
	IncompatCompressed = 1 << 3
	IncompatExtendedL2 = 1 << 4
)

// Limits of the format and of QEMU (block/qcow2.h, block/qcow2-bitmap.c):
// QEMU refuses to open an image beyond them, and so does this package,
// before it reads or allocates anything by a size the image states.
const (
	minClusterBits = 9
	maxClusterBits = 21
	// Extended L2 entries split a cluster in 32 subclusters of at least
	// 512 bytes.
	minExtendedL2ClusterBits = 14
	maxRefcountOrder         = 6
	// maxL1Entries: QEMU's active L1 table is at most 32 MiB.
	maxL1Entries = 32 << 20 / 8
	// maxRefcountTableBytes: QEMU's refcount table is at most 8 MiB.
	maxRefcountTableBytes = 8 << 20
	maxSnapshots          = 65536
	// maxBackingNameLength is QEMU's limit on the backing file name.
	maxBackingNameLength = 1023
	// maxBackingFormatLength: QEMU keeps the backing format in 16 bytes,
	// the terminating NUL included.
	maxBackingFormatLength = 15
	bitmapsExtensionLength = 24
	maxBitmaps             = 65535
	maxBitmapDirectorySize = 1024 * maxBitmaps
	// maxBitmapDataBytes bounds the data clusters of one bitmap, so the
	// entries of its table.
	maxBitmapDataBytes = 512 << 20
)

// ErrNotQcow2 is returned for a file that does not start with a qcow2 header.
var ErrNotQcow2 = errors.New("not a qcow2 image")

// Header is the part of a qcow2 header an overlay manager looks at.
type Header struct {
	Version               uint32
	BackingFile           string
	BackingFormat         string
	ClusterBits           uint32
	Size                  uint64
	L1Size                uint32
	L1TableOffset         uint64
	RefcountTableOffset   uint64
	RefcountTableClusters uint32
	NbSnapshots           uint32
	SnapshotsOffset       uint64
	Incompatible          uint64
	Compatible            uint64
	Autoclear             uint64
	RefcountOrder         uint32
	HeaderLength          uint32
	// DataFile is the external data file's name, when the image has one.
	DataFile string
	// Bitmaps is the bitmaps extension, when the image has one.
	Bitmaps *BitmapsExtension
}

// BitmapsExtension locates the persistent dirty bitmaps of an image.
type BitmapsExtension struct {
	Count           uint32
	DirectorySize   uint64
	DirectoryOffset uint64
}

// ClusterSize is the image's cluster size in bytes.
func (h *Header) ClusterSize() uint64 { return 1 << h.ClusterBits }

// Dirty reports whether the image was not closed cleanly with lazy
// refcounts: its refcounts may be stale until QEMU repairs them.
func (h *Header) Dirty() bool { return h.Incompatible&IncompatDirty != 0 }

// Corrupt reports whether QEMU marked the image corrupt.
func (h *Header) Corrupt() bool { return h.Incompatible&IncompatCorrupt != 0 }

// ExtendedL2 reports whether L2 entries carry subcluster bitmaps.
func (h *Header) ExtendedL2() bool { return h.Incompatible&IncompatExtendedL2 != 0 }

// LazyRefcounts reports whether the image defers refcount updates.
func (h *Header) LazyRefcounts() bool { return h.Compatible&CompatLazyRefcounts != 0 }

// l2EntrySize is the size of one L2 table entry in bytes.
func (h *Header) l2EntrySize() uint64 { return 1 << h.l2EntryBits() }

func (h *Header) l2EntryBits() uint32 {
	if h.ExtendedL2() {
		return 4
	}
	return 3
}

// ReadHeader reads and validates the header of the qcow2 image at path. A
// header whose sizes or offsets QEMU refuses to open is refused too, before
// anything is read or allocated by them.
func ReadHeader(path string) (*Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read qcow2 header of %s: %w", path, err)
	}
	defer f.Close()
	h, err := readHeader(f)
	if err != nil {
		return nil, fmt.Errorf("read qcow2 header of %s: %w", path, err)
	}
	return h, nil
}

func readHeader(r io.ReaderAt) (*Header, error) {
	buf := make([]byte, headerV3Length)
	if _, err := r.ReadAt(buf, 0); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ErrNotQcow2
		}
		return nil, err
	}
	be := binary.BigEndian
	if be.Uint32(buf[0:]) != magic {
		return nil, ErrNotQcow2
	}
	h := &Header{Version: be.Uint32(buf[4:])}
	if h.Version != 2 && h.Version != 3 {
		return nil, fmt.Errorf("unsupported qcow2 version %d", h.Version)
	}
	backingOffset := be.Uint64(buf[8:])
	backingSize := be.Uint32(buf[16:])
	h.ClusterBits = be.Uint32(buf[20:])
	h.Size = be.Uint64(buf[24:])
	if crypt := be.Uint32(buf[32:]); crypt != 0 {
		return nil, fmt.Errorf("encrypted images are not supported (method %d)", crypt)
	}
	h.L1Size = be.Uint32(buf[36:])
	h.L1TableOffset = be.Uint64(buf[40:])
	h.RefcountTableOffset = be.Uint64(buf[48:])
	h.RefcountTableClusters = be.Uint32(buf[56:])
	h.NbSnapshots = be.Uint32(buf[60:])
	h.SnapshotsOffset = be.Uint64(buf[64:])
	h.RefcountOrder = 4
	h.HeaderLength = headerV2Length
	if h.Version == 3 {
		h.Incompatible = be.Uint64(buf[72:])
		h.Compatible = be.Uint64(buf[80:])
		h.Autoclear = be.Uint64(buf[88:])
		h.RefcountOrder = be.Uint32(buf[96:])
		h.HeaderLength = be.Uint32(buf[100:])
	}
	if err := h.validate(backingOffset); err != nil {
		return nil, err
	}
	// Header extensions end where the backing file name starts.
	extEnd := h.ClusterSize()
	if backingOffset != 0 {
		extEnd = backingOffset
	}
	if h.Version == 3 {
		if err := h.readExtensions(r, extEnd); err != nil {
			return nil, err
		}
	}
	if backingOffset != 0 {
		if backingSize > maxBackingNameLength {
			return nil, fmt.Errorf("backing file name of %d bytes exceeds QEMU's limit of %d", backingSize, maxBackingNameLength)
		}
		if uint64(backingSize) > h.ClusterSize()-backingOffset {
			return nil, fmt.Errorf("backing file name of %d bytes at %#x runs past the first cluster", backingSize, backingOffset)
		}
		name := make([]byte, backingSize)
		if _, err := r.ReadAt(name, int64(backingOffset)); err != nil {
			return nil, fmt.Errorf("read backing file name: %w", err)
		}
		h.BackingFile = string(name)
	}
	return h, nil
}

// validate refuses the header fields QEMU refuses, and sizes beyond QEMU's
// limits.
func (h *Header) validate(backingOffset uint64) error {
	if h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits {
		return fmt.Errorf("invalid cluster bits %d", h.ClusterBits)
	}
	cs := h.ClusterSize()
	if h.Version == 3 && h.HeaderLength < headerV3Length {
		return fmt.Errorf("header length %d is shorter than version 3's %d", h.HeaderLength, headerV3Length)
	}
	if uint64(h.HeaderLength) > cs {
		return fmt.Errorf("header length %d exceeds the cluster size %d", h.HeaderLength, cs)
	}
	if backingOffset > cs {
		return fmt.Errorf("backing file name offset %#x is beyond the first cluster", backingOffset)
	}
	if unknown := h.Incompatible &^ knownIncompatible; unknown != 0 {
		return fmt.Errorf("unknown incompatible features %#x", unknown)
	}
	if h.RefcountOrder > maxRefcountOrder {
		return fmt.Errorf("invalid refcount order %d", h.RefcountOrder)
	}
	if h.ExtendedL2() && h.ClusterBits < minExtendedL2ClusterBits {
		return fmt.Errorf("extended L2 entries need clusters of at least %d KiB, not %d bytes", 1<<(minExtendedL2ClusterBits-10), cs)
	}

	if h.RefcountTableClusters == 0 {
		return fmt.Errorf("image has no refcount table")
	}
	if limit := uint32(maxRefcountTableBytes / cs); h.RefcountTableClusters > limit {
		return fmt.Errorf("refcount table of %d clusters exceeds QEMU's limit of %d", h.RefcountTableClusters, limit)
	}
	if err := h.validateTable("refcount table", h.RefcountTableOffset, uint64(h.RefcountTableClusters)*cs); err != nil {
		return err
	}

	if h.NbSnapshots > maxSnapshots {
		return fmt.Errorf("%d snapshots exceed QEMU's limit of %d", h.NbSnapshots, maxSnapshots)
	}
	// A snapshot table entry is at least 40 bytes.
	if err := h.validateTable("snapshot table", h.SnapshotsOffset, uint64(h.NbSnapshots)*40); err != nil {
		return err
	}

	if h.L1Size > maxL1Entries {
		return fmt.Errorf("L1 size %d exceeds QEMU's limit of %d entries", h.L1Size, maxL1Entries)
	}
	// An L1 entry maps an L2 table, which maps a cluster per entry.
	perL1Entry := uint64(1) << (2*h.ClusterBits - h.l2EntryBits())
	need := h.Size / perL1Entry
	if h.Size%perL1Entry != 0 {
		need++
	}
	if need > uint64(h.L1Size) {
		return fmt.Errorf("L1 size %d is too small for a virtual size of %d bytes", h.L1Size, h.Size)
	}
	return h.validateTable("L1 table", h.L1TableOffset, uint64(h.L1Size)*8)
}

// validateTable refuses a table that is not cluster aligned or ends beyond
// what a file offset can express.
func (h *Header) validateTable(what string, offset, length uint64) error {
	if offset%h.ClusterSize() != 0 {
		return fmt.Errorf("%s offset %#x is not cluster aligned", what, offset)
	}
	if offset > math.MaxInt64-length {
		return fmt.Errorf("%s at %#x (%d bytes) ends beyond any file", what, offset, length)
	}
	return nil
}

// readExtensions walks the header extensions that follow the header, up to
// end: the backing file name or the end of the first cluster. Unknown
// extensions are skipped unread.
func (h *Header) readExtensions(r io.ReaderAt, end uint64) error {
	be := binary.BigEndian
	off := uint64(h.HeaderLength)
	for off < end {
		var hdr [8]byte
		if _, err := r.ReadAt(hdr[:], int64(off)); err != nil {
			return fmt.Errorf("read header extension at %d: %w", off, err)
		}
		typ, length := be.Uint32(hdr[0:]), uint64(be.Uint32(hdr[4:]))
		off += 8
		if off > end || length > end-off {
			return fmt.Errorf("header extension %#x of %d bytes runs past offset %d", typ, length, end)
		}
		switch typ {
		case extEnd:
			return nil
		case extBackingFormat:
			if length > maxBackingFormatLength {
				return fmt.Errorf("backing format of %d bytes exceeds QEMU's limit of %d", length, maxBackingFormatLength)
			}
			data, err := readExtension(r, typ, off, length)
			if err != nil {
				return err
			}
			h.BackingFormat = string(data)
		case extDataFile:
			data, err := readExtension(r, typ, off, length)
			if err != nil {
				return err
			}
			h.DataFile = string(data)
		case extBitmaps:
			if err := h.readBitmapsExtension(r, off, length); err != nil {
				return err
			}
		}
		off += (length + 7) &^ 7
	}
	return nil
}

func readExtension(r io.ReaderAt, typ uint32, offset, length uint64) ([]byte, error) {
	data := make([]byte, length)
	if _, err := r.ReadAt(data, int64(offset)); err != nil {
		return nil, fmt.Errorf("read header extension %#x: %w", typ, err)
	}
	return data, nil
}

// readBitmapsExtension reads the bitmaps extension, which QEMU ignores
// (and drops) unless the autoclear bit says that it is consistent.
func (h *Header) readBitmapsExtension(r io.ReaderAt, offset, length uint64) error {
	if h.Autoclear&AutoclearBitmaps == 0 {
		return nil
	}
	if length != bitmapsExtensionLength {
		return fmt.Errorf("bitmaps extension of %d bytes, not %d", length, bitmapsExtensionLength)
	}
	data, err := readExtension(r, extBitmaps, offset, length)
	if err != nil {
		return err
	}
	be := binary.BigEndian
	b := &BitmapsExtension{
		Count:           be.Uint32(data[0:]),
		DirectorySize:   be.Uint64(data[8:]),
		DirectoryOffset: be.Uint64(data[16:]),
	}
	switch {
	case be.Uint32(data[4:]) != 0:
		return fmt.Errorf("bitmaps extension: reserved field is not zero")
	case b.Count == 0:
		return fmt.Errorf("bitmaps extension with no bitmaps")
	case b.Count > maxBitmaps:
		return fmt.Errorf("%d bitmaps exceed QEMU's limit of %d", b.Count, maxBitmaps)
	case b.DirectoryOffset%h.ClusterSize() != 0:
		return fmt.Errorf("bitmap directory offset %#x is not cluster aligned", b.DirectoryOffset)
	case b.DirectorySize > maxBitmapDirectorySize:
		return fmt.Errorf("bitmap directory of %d bytes exceeds QEMU's limit of %d", b.DirectorySize, maxBitmapDirectorySize)
	}
	h.Bitmaps = b
	return nil
}
