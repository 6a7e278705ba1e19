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
	// IdentitySampled hashes the size, the first and last MiB and 62
	// evenly spaced 64 KiB blocks: a few MiB read whatever the size, which
	// catches a replaced or reformatted image but not a change confined to
	// blocks it does not read.
	IdentitySampled = "sampled-sha256"
	// IdentityFull hashes every byte: exact, and as slow as reading the
	// whole image.
	IdentityFull = "sha256"
)

const (
	sampleEdge    = 1 << 20
	sampleBlock   = 64 << 10
	sampleBetween = 62
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
		err = copyWithContext(ctx, h, io.NewSectionReader(f, 0, size))
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
	if size <= 2*sampleEdge+sampleBetween*sampleBlock {
		return copyWithContext(ctx, w, io.NewSectionReader(r, 0, size))
	}
	if err := copyWithContext(ctx, w, io.NewSectionReader(r, 0, sampleEdge)); err != nil {
		return err
	}
	// Evenly spaced between the edges, aligned to 4 KiB.
	span := size - 2*sampleEdge - sampleBlock
	for i := int64(1); i <= sampleBetween; i++ {
		off := sampleEdge + (span*i/(sampleBetween+1))&^4095
		if err := copyWithContext(ctx, w, io.NewSectionReader(r, off, sampleBlock)); err != nil {
			return err
		}
	}
	return copyWithContext(ctx, w, io.NewSectionReader(r, size-sampleEdge, sampleEdge))
}

// copyWithContext copies in 1 MiB steps and stops when ctx is done.
func copyWithContext(ctx context.Context, w io.Writer, r io.Reader) error {
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
