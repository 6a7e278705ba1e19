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

package overlay

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// Ways to fingerprint a backing image.
const (
	// IdentitySampled hashes the size, the first and last 256 KiB and 254
	// evenly spaced 4 KiB blocks: 1.5 MiB read whatever the size, which
	// catches a replaced, resized or reformatted image but not a change
	// confined to blocks it does not read.
	IdentitySampled = "sampled-sha256"
	// IdentityFull hashes every byte: exact, and as slow as reading the
	// whole image.
	IdentityFull = "sha256"
)

const (
	sampleEdge    = 256 << 10
	sampleBlock   = 4 << 10
	sampleBetween = 254
)

// Identity fingerprints a backing image's bytes, so that an overlay is
// never used over a backing that changed after it was created.
type Identity struct {
	Method string `json:"method"`
	Size   int64  `json:"size"`
	Digest string `json:"digest"`
}

// Identify fingerprints the file or block device at path with method.
func Identify(ctx context.Context, path, method string) (Identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return Identity{}, fmt.Errorf("identify backing %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return Identity{}, fmt.Errorf("identify backing %s: %w", path, err)
	}
	h := sha256.New()
	_ = binary.Write(h, binary.BigEndian, size)
	switch method {
	case IdentityFull:
		err = copyWithContext(ctx, h, f, size)
	case IdentitySampled:
		err = hashSamples(ctx, h, f, size)
	default:
		return Identity{}, fmt.Errorf("identify backing %s: unknown method %q", path, method)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("identify backing %s: %w", path, err)
	}
	return Identity{Method: method, Size: size, Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))}, nil
}

func hashSamples(ctx context.Context, w io.Writer, r io.ReaderAt, size int64) error {
	buf := make([]byte, sampleEdge)
	if size <= 2*sampleEdge+sampleBetween*sampleBlock {
		return hashRange(ctx, w, r, 0, size, buf)
	}
	if err := hashRange(ctx, w, r, 0, sampleEdge, buf); err != nil {
		return err
	}
	// Evenly spaced between the edges, aligned to 4 KiB.
	span := size - 2*sampleEdge - sampleBlock
	for i := int64(1); i <= sampleBetween; i++ {
		off := sampleEdge + (span*i/(sampleBetween+1))&^4095
		if err := hashRange(ctx, w, r, off, sampleBlock, buf); err != nil {
			return err
		}
	}
	return hashRange(ctx, w, r, size-sampleEdge, sampleEdge, buf)
}

// copyWithContext copies r to w in 1 MiB steps and stops when ctx is done.
func copyWithContext(ctx context.Context, w io.Writer, r io.ReaderAt, size int64) error {
	return hashRange(ctx, w, r, 0, size, make([]byte, 1<<20))
}

// hashRange copies [off, off+n) of r to w through buf, checking ctx
// between reads.
func hashRange(ctx context.Context, w io.Writer, r io.ReaderAt, off, n int64, buf []byte) error {
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := buf
		if int64(len(chunk)) > n {
			chunk = chunk[:n]
		}
		read, err := r.ReadAt(chunk, off)
		if read > 0 {
			if _, werr := w.Write(chunk[:read]); werr != nil {
				return werr
			}
			off += int64(read)
			n -= int64(read)
		}
		if err == io.EOF && n > 0 {
			return io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}
