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

package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

// CreateBootDisk creates a sparse raw image of size bytes holding the test
// guest, with p patched in, at sector 0.
func CreateBootDisk(ctx context.Context, path string, size int64, p GuestParams) error {
	sector, err := p.BootSector(ctx)
	if err != nil {
		return fmt.Errorf("create boot disk %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create boot disk: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("create boot disk %s: %w", path, err)
	}
	if _, err := f.WriteAt(sector, 0); err != nil {
		f.Close()
		return fmt.Errorf("create boot disk %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create boot disk %s: %w", path, err)
	}
	return nil
}

// WriteBootSector writes the test guest with p into sector 0 of an existing
// image of any format, e.g. an overlay, so guests sharing a backing image
// can write differently.
func WriteBootSector(ctx context.Context, image, format string, p GuestParams) error {
	sector, err := p.BootSector(ctx)
	if err != nil {
		return fmt.Errorf("write boot sector into %s: %w", image, err)
	}
	tmp, err := os.CreateTemp("", "bootsector-")
	if err != nil {
		return fmt.Errorf("write boot sector into %s: %w", image, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(sector); err != nil {
		tmp.Close()
		return fmt.Errorf("write boot sector into %s: %w", image, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write boot sector into %s: %w", image, err)
	}
	if _, err := QemuIO(ctx, image, format, fmt.Sprintf("write -q -s %s 0 %d", tmp.Name(), SectorSize)); err != nil {
		return fmt.Errorf("write boot sector: %w", err)
	}
	return nil
}

// QemuImg runs qemu-img and returns its standard output.
func QemuImg(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "qemu-img", args...)
}

// ReadSectors reads count sectors from lba on of an image of any format,
// through its backing chain, and also from a json: name (format empty). It
// opens the image shared (-U); a qcow2 image a running QEMU writes may show
// stale metadata, so stop the domain first.
func ReadSectors(ctx context.Context, image, format string, lba, count uint64) ([]byte, error) {
	node, err := blockNode(image, format)
	if err != nil {
		return nil, fmt.Errorf("read sectors of %s: %w", image, err)
	}
	// A raw node with offset and size over the image is the range alone.
	window, err := json.Marshal(map[string]any{
		"driver": "raw",
		"offset": lba * SectorSize,
		"size":   count * SectorSize,
		"file":   node,
	})
	if err != nil {
		return nil, fmt.Errorf("read sectors of %s: %w", image, err)
	}
	dir, err := os.MkdirTemp("", "sectors-")
	if err != nil {
		return nil, fmt.Errorf("read sectors of %s: %w", image, err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "sectors.raw")
	if _, err := QemuImg(ctx, "convert", "-U", "-O", "raw", "json:"+string(window), out); err != nil {
		return nil, fmt.Errorf("read sectors %d+%d of %s: %w", lba, count, image, err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("read sectors of %s: %w", image, err)
	}
	if want := count * SectorSize; uint64(len(data)) != want {
		return nil, fmt.Errorf("read sectors %d+%d of %s: got %d bytes, want %d", lba, count, image, len(data), want)
	}
	return data, nil
}

// blockNode is QEMU's block node description of an image path in format,
// or the one a json: name holds.
func blockNode(image, format string) (map[string]any, error) {
	if spec, ok := strings.CutPrefix(image, "json:"); ok {
		var node map[string]any
		if err := json.Unmarshal([]byte(spec), &node); err != nil {
			return nil, fmt.Errorf("parse %s: %w", image, err)
		}
		return node, nil
	}
	if format == "" {
		return nil, errors.New("no image format given")
	}
	return map[string]any{"driver": format, "file": map[string]any{"filename": image}}, nil
}

// VerifyGuestWrites checks that the sectors the test guest with p writes
// hold its pattern in the image.
func VerifyGuestWrites(ctx context.Context, image, format string, p GuestParams) error {
	data, err := ReadSectors(ctx, image, format, p.StartLBA, uint64(p.Sectors))
	if err != nil {
		return err
	}
	if err := VerifyGuestData(data, p.StartLBA, p.Seed); err != nil {
		return fmt.Errorf("guest writes in %s: %w", image, err)
	}
	return nil
}

// SHA256 hashes a file or a block device and returns the hex digest.
func SHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// QemuIO runs qemu-io commands (-c) against an image and returns the output.
func QemuIO(ctx context.Context, image, format string, commands ...string) (string, error) {
	var args []string
	if format != "" {
		args = append(args, "-f", format)
	}
	for _, c := range commands {
		args = append(args, "-c", c)
	}
	out, err := run(ctx, "qemu-io", append(args, image)...)
	if err != nil {
		return out, fmt.Errorf("qemu-io on %s: %w", image, err)
	}
	return out, nil
}

// OverlayOver names a qcow2 overlay over backing in backingFormat, for an
// overlay whose header names its backing where this host does not have it
// (a path of the compute container).
func OverlayOver(overlay, backing, backingFormat string) string {
	// Maps of strings and nil always marshal.
	data, _ := json.Marshal(map[string]any{
		"driver":  "qcow2",
		"file":    protocolNode(overlay),
		"backing": map[string]any{"driver": backingFormat, "file": protocolNode(backing)},
	})
	return "json:" + string(data)
}

func protocolNode(path string) map[string]any {
	driver := "file"
	if blockdev.Is(path) {
		driver = "host_device"
	}
	return map[string]any{"driver": driver, "filename": path}
}
