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
	"fmt"
	"io"
	"os"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

// Images is what the Manager needs from an image tool.
type Images interface {
	// CreateOverlay writes a new, empty qcow2 image at path over backing.
	// The image records backing.Path; backing.local() is where the tool
	// may read the backing.
	CreateOverlay(ctx context.Context, path string, backing Backing, size int64, opts CreateOptions) error
	// Inspect reads an image's header without opening its backing.
	Inspect(ctx context.Context, path string) (*Header, error)
	// Check verifies an image's metadata; a damaged image is a result
	// with Clean false, not an error.
	Check(ctx context.Context, path string) (*CheckResult, error)
	// VirtualSize is the size the guest sees of the image at path.
	VirtualSize(ctx context.Context, path, format string) (int64, error)
}

// Header is what validation reads from an existing overlay.
type Header struct {
	Format        string
	BackingFile   string
	BackingFormat string
	VirtualSize   int64
	DataFile      string
	Corrupt       bool
}

// CheckResult summarises a metadata check.
type CheckResult struct {
	Clean  bool
	Detail string
}

// CreateOptions tune a new overlay. Zero values take QEMU's defaults.
type CreateOptions struct {
	ClusterSize   int64
	ExtendedL2    bool
	LazyRefcounts bool
}

// Native implements Images in Go, with no qemu-img: for a sidecar image
// that holds one static binary.
type Native struct{}

var _ Images = Native{}

// CreateOverlay implements Images.
func (Native) CreateOverlay(_ context.Context, path string, backing Backing, size int64, opts CreateOptions) error {
	return qcow2meta.CreateOverlay(path, backing.Path, backing.Format, size, qcow2meta.Options(opts))
}

// Inspect implements Images.
func (Native) Inspect(_ context.Context, path string) (*Header, error) {
	h, err := qcow2meta.ReadHeader(path)
	if err != nil {
		return nil, err
	}
	return &Header{
		Format:        qcow2.FormatQcow2,
		BackingFile:   h.BackingFile,
		BackingFormat: h.BackingFormat,
		VirtualSize:   int64(h.Size),
		DataFile:      h.DataFile,
		Corrupt:       h.Corrupt(),
	}, nil
}

// Check implements Images.
func (Native) Check(ctx context.Context, path string) (*CheckResult, error) {
	res, err := qcow2meta.Check(ctx, path)
	if err != nil {
		return nil, err
	}
	return &CheckResult{Clean: res.Clean(), Detail: res.String()}, nil
}

// VirtualSize implements Images: the byte size of a raw file or block
// device, the header's size of a qcow2 image.
func (Native) VirtualSize(_ context.Context, path, format string) (int64, error) {
	switch format {
	case qcow2.FormatRaw:
		return byteSize(path)
	case qcow2.FormatQcow2:
		h, err := qcow2meta.ReadHeader(path)
		if err != nil {
			return 0, err
		}
		return int64(h.Size), nil
	default:
		return 0, fmt.Errorf("size of %s: unsupported format %q", path, format)
	}
}

// byteSize is the size of a regular file or a block device.
func byteSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return size, nil
}

// QemuImg implements Images with qemu-img, for processes that have it.
type QemuImg struct {
	Tool qcow2.Tool
}

var _ Images = QemuImg{}

// CreateOverlay implements Images. qemu-img opens the backing where this
// process sees it; when QEMU will see it elsewhere, the recorded name is
// then rewritten without touching data.
func (q QemuImg) CreateOverlay(ctx context.Context, path string, backing Backing, size int64, opts CreateOptions) error {
	copts := qcow2.CreateOptions{Size: size, ClusterSize: opts.ClusterSize, ExtendedL2: opts.ExtendedL2, LazyRefcounts: opts.LazyRefcounts}
	if err := q.Tool.CreateOverlay(ctx, path, backing.local(), backing.Format, copts); err != nil {
		return err
	}
	if backing.local() == backing.Path {
		return nil
	}
	return q.Tool.Rebase(ctx, path, backing.Path, backing.Format)
}

// Inspect implements Images.
func (q QemuImg) Inspect(ctx context.Context, path string) (*Header, error) {
	info, err := q.Tool.Info(ctx, path, qcow2.InfoOptions{NoBacking: true, Shared: true})
	if err != nil {
		return nil, err
	}
	return &Header{
		Format:        info.Format,
		BackingFile:   info.BackingFilename,
		BackingFormat: info.BackingFormat,
		VirtualSize:   info.VirtualSize,
		DataFile:      info.FormatSpecific.Data.DataFile,
		Corrupt:       info.FormatSpecific.Data.Corrupt,
	}, nil
}

// Check implements Images.
func (q QemuImg) Check(ctx context.Context, path string) (*CheckResult, error) {
	res, err := q.Tool.Check(ctx, path, qcow2.InfoOptions{NoBacking: true})
	if err != nil {
		return nil, err
	}
	return &CheckResult{
		Clean:  res.Clean(),
		Detail: fmt.Sprintf("%d errors, %d corruptions, %d leaks", res.CheckErrors, res.Corruptions, res.Leaks),
	}, nil
}

// VirtualSize implements Images.
func (q QemuImg) VirtualSize(ctx context.Context, path, format string) (int64, error) {
	info, err := q.Tool.Info(ctx, path, qcow2.InfoOptions{Format: format, NoBacking: format == qcow2.FormatQcow2})
	if err != nil {
		return 0, err
	}
	return info.VirtualSize, nil
}
