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
	"os"
)

const (
	magic = 0x514649fb // "QFI\xfb"

	headerV3Length = 104
	// headerLength is what this package writes: the version 3 header plus
	// the compression type byte, padded to a multiple of 8.
	headerLength = 112

	extEnd           = 0x00000000
	extBackingFormat = 0xe2792aca
	extBitmaps       = 0x23852875
	extDataFile      = 0x44415441

	// Incompatible feature bits.
	IncompatDirty      = 1 << 0
	IncompatCorrupt    = 1 << 1
	IncompatDataFile   = 1 << 2
	IncompatCompressed = 1 << 3
	IncompatExtendedL2 = 1 << 4
	knownIncompatible  = IncompatDirty | IncompatCorrupt | IncompatDataFile | IncompatCompressed | IncompatExtendedL2

	// CompatLazyRefcounts is the compatible feature bit for lazy refcounts.
	CompatLazyRefcounts = 1 << 0

	// AutoclearBitmaps marks the bitmaps extension consistent.
	AutoclearBitmaps = 1 << 0

	// maxBackingNameLength is QEMU's limit on the backing file name.
	maxBackingNameLength = 1023
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
func (h *Header) l2EntrySize() uint64 {
	if h.ExtendedL2() {
		return 16
	}
	return 8
}

// ReadHeader reads and validates the header of the qcow2 image at path.
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
	h.HeaderLength = 72
	if h.Version == 3 {
		h.Incompatible = be.Uint64(buf[72:])
		h.Compatible = be.Uint64(buf[80:])
		h.Autoclear = be.Uint64(buf[88:])
		h.RefcountOrder = be.Uint32(buf[96:])
		h.HeaderLength = be.Uint32(buf[100:])
	}
	if h.ClusterBits < 9 || h.ClusterBits > 21 {
		return nil, fmt.Errorf("invalid cluster bits %d", h.ClusterBits)
	}
	if h.RefcountOrder > 6 {
		return nil, fmt.Errorf("invalid refcount order %d", h.RefcountOrder)
	}
	if unknown := h.Incompatible &^ knownIncompatible; unknown != 0 {
		return nil, fmt.Errorf("unknown incompatible features %#x", unknown)
	}
	if h.HeaderLength < 72 || uint64(h.HeaderLength) > h.ClusterSize() {
		return nil, fmt.Errorf("invalid header length %d", h.HeaderLength)
	}
	if h.Version == 3 {
		if err := h.readExtensions(r); err != nil {
			return nil, err
		}
	}
	if backingOffset != 0 {
		if backingSize > maxBackingNameLength || backingOffset+uint64(backingSize) > h.ClusterSize() {
			return nil, fmt.Errorf("invalid backing file name at %d (%d bytes)", backingOffset, backingSize)
		}
		name := make([]byte, backingSize)
		if _, err := r.ReadAt(name, int64(backingOffset)); err != nil {
			return nil, fmt.Errorf("read backing file name: %w", err)
		}
		h.BackingFile = string(name)
	}
	return h, nil
}

// readExtensions walks the header extensions that follow the header inside
// the first cluster.
func (h *Header) readExtensions(r io.ReaderAt) error {
	be := binary.BigEndian
	off := uint64(h.HeaderLength)
	for {
		if off+8 > h.ClusterSize() {
			return fmt.Errorf("header extensions run past the first cluster")
		}
		var hdr [8]byte
		if _, err := r.ReadAt(hdr[:], int64(off)); err != nil {
			return fmt.Errorf("read header extension at %d: %w", off, err)
		}
		typ, length := be.Uint32(hdr[0:]), uint64(be.Uint32(hdr[4:]))
		if typ == extEnd {
			return nil
		}
		off += 8
		if off+length > h.ClusterSize() {
			return fmt.Errorf("header extension %#x runs past the first cluster", typ)
		}
		data := make([]byte, length)
		if _, err := r.ReadAt(data, int64(off)); err != nil {
			return fmt.Errorf("read header extension %#x: %w", typ, err)
		}
		switch typ {
		case extBackingFormat:
			h.BackingFormat = string(data)
		case extDataFile:
			h.DataFile = string(data)
		case extBitmaps:
			if length < 24 {
				return fmt.Errorf("bitmaps extension too short (%d bytes)", length)
			}
			h.Bitmaps = &BitmapsExtension{
				Count:           be.Uint32(data[0:]),
				DirectorySize:   be.Uint64(data[8:]),
				DirectoryOffset: be.Uint64(data[16:]),
			}
		}
		off += (length + 7) &^ 7
	}
}
