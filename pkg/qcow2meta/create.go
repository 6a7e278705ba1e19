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
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultClusterSize is QEMU's default cluster size.
const DefaultClusterSize = 64 << 10

// Options tune a new image. Zero values take QEMU's defaults.
type Options struct {
	ClusterSize   int64
	ExtendedL2    bool
	LazyRefcounts bool
}

// CreateOverlay writes an empty qcow2 version 3 image of size bytes at path
// whose backing file is backing in backingFormat, laid out as qemu-img lays
// out a fresh image: header, refcount table, one refcount block, L1 table.
// The backing is only recorded, never opened: it may be a path that only
// another container can see.
//
// A regular file at path is truncated; a block device is written in place,
// and only the metadata clusters are written. The data is synced before
// CreateOverlay returns. Callers that need atomicity write to a temporary
// name and rename.
func CreateOverlay(path, backing, backingFormat string, size int64, opts Options) error {
	img, err := newLayout(backing, backingFormat, size, opts)
	if err != nil {
		return fmt.Errorf("create qcow2 overlay %s: %w", path, err)
	}
	flags := os.O_WRONLY | os.O_CREATE
	if fi, err := os.Stat(path); err != nil || fi.Mode().IsRegular() {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o660)
	if err != nil {
		return fmt.Errorf("create qcow2 overlay %s: %w", path, err)
	}
	if _, err := f.WriteAt(img, 0); err != nil {
		f.Close()
		return fmt.Errorf("create qcow2 overlay %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("create qcow2 overlay %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create qcow2 overlay %s: %w", path, err)
	}
	return nil
}

// newLayout returns the metadata clusters of an empty overlay.
func newLayout(backing, backingFormat string, size int64, opts Options) ([]byte, error) {
	cs := opts.ClusterSize
	if cs == 0 {
		cs = DefaultClusterSize
	}
	if cs < 512 || cs > 2<<20 || cs&(cs-1) != 0 {
		return nil, fmt.Errorf("cluster size %d is not a power of two between 512 and 2M", cs)
	}
	if opts.ExtendedL2 && cs < 16<<10 {
		return nil, fmt.Errorf("extended L2 entries need a cluster size of at least 16K, not %d", cs)
	}
	if size <= 0 {
		return nil, fmt.Errorf("size %d is not positive", size)
	}
	if !filepath.IsAbs(backing) {
		return nil, fmt.Errorf("backing path %q is not absolute", backing)
	}
	if len(backing) > maxBackingNameLength {
		return nil, fmt.Errorf("backing path is longer than %d bytes", maxBackingNameLength)
	}
	if backingFormat == "" || len(backingFormat) > maxBackingFormatLength {
		return nil, fmt.Errorf("invalid backing format %q", backingFormat)
	}

	clusterBits := uint32(0)
	for int64(1)<<clusterBits < cs {
		clusterBits++
	}
	l2Entry := int64(8)
	var incompatible, compatible uint64
	if opts.ExtendedL2 {
		l2Entry = 16
		incompatible |= IncompatExtendedL2
	}
	if opts.LazyRefcounts {
		compatible |= CompatLazyRefcounts
	}
	bytesPerL1Entry := cs * (cs / l2Entry)
	l1Size := (size + bytesPerL1Entry - 1) / bytesPerL1Entry
	if l1Size > maxL1Entries {
		return nil, fmt.Errorf("size %d needs too large an L1 table", size)
	}
	l1Clusters := (l1Size*8 + cs - 1) / cs
	// Header, refcount table, refcount blocks, L1 table: the refcount
	// structures must count themselves too.
	const refcountBits = 16
	perBlock := cs * 8 / refcountBits
	tableClusters, blocks := int64(1), int64(1)
	for {
		total := 1 + tableClusters + blocks + l1Clusters
		needBlocks := (total + perBlock - 1) / perBlock
		needTable := (needBlocks*8 + cs - 1) / cs
		if needBlocks == blocks && needTable == tableClusters {
			break
		}
		blocks, tableClusters = needBlocks, needTable
	}
	refcountTableCluster := int64(1)
	refcountBlockCluster := refcountTableCluster + tableClusters
	l1Cluster := refcountBlockCluster + blocks
	totalClusters := l1Cluster + l1Clusters

	img := make([]byte, totalClusters*cs)
	be := binary.BigEndian

	// Header extensions follow the header; the backing file name follows
	// the end marker.
	ext := headerLength
	be.PutUint32(img[ext:], extBackingFormat)
	be.PutUint32(img[ext+4:], uint32(len(backingFormat)))
	copy(img[ext+8:], backingFormat)
	ext += 8 + (len(backingFormat)+7)&^7
	be.PutUint32(img[ext:], extEnd)
	be.PutUint32(img[ext+4:], 0)
	backingOffset := ext + 8
	copy(img[backingOffset:], backing)

	be.PutUint32(img[0:], magic)
	be.PutUint32(img[4:], 3)
	be.PutUint64(img[8:], uint64(backingOffset))
	be.PutUint32(img[16:], uint32(len(backing)))
	be.PutUint32(img[20:], clusterBits)
	be.PutUint64(img[24:], uint64(size))
	be.PutUint32(img[32:], 0) // no encryption
	be.PutUint32(img[36:], uint32(l1Size))
	be.PutUint64(img[40:], uint64(l1Cluster*cs))
	be.PutUint64(img[48:], uint64(refcountTableCluster*cs))
	be.PutUint32(img[56:], uint32(tableClusters))
	be.PutUint32(img[60:], 0)
	be.PutUint64(img[64:], 0)
	be.PutUint64(img[72:], incompatible)
	be.PutUint64(img[80:], compatible)
	be.PutUint64(img[88:], 0)
	be.PutUint32(img[96:], 4) // refcount order: 16-bit refcounts
	be.PutUint32(img[100:], headerLength)
	// img[104] compression type zlib (0), then padding.

	for b := int64(0); b < blocks; b++ {
		be.PutUint64(img[refcountTableCluster*cs+8*b:], uint64((refcountBlockCluster+b)*cs))
	}
	// The refcount blocks are contiguous: cluster i's refcount is entry i.
	for i := int64(0); i < totalClusters; i++ {
		be.PutUint16(img[refcountBlockCluster*cs+2*i:], 1)
	}
	return img, nil
}
