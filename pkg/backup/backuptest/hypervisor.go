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

// Package backuptest holds a stand-in hypervisor for tests of package
// backup: it keeps a raw "live" disk, records the writes made to it, and
// answers backups with qcow2 files shaped like libvirt's push-mode output —
// a full file without backing, incrementals holding only the writes since
// the parent checkpoint and naming the live disk as their backing file. It
// runs qemu-img and qemu-io; it is no hypervisor.
package backuptest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

type write struct {
	offset, length int64
	pattern        byte
}

// Hypervisor is the stand-in. Disk is the name its single disk has.
type Hypervisor struct {
	Disk string
	live string

	mu          sync.Mutex
	writes      []write
	checkpoints map[string]int
	order       []string
}

// New creates a live raw disk of size bytes in dir.
func New(ctx context.Context, dir string, size int64) (*Hypervisor, error) {
	h := &Hypervisor{Disk: "vda", live: filepath.Join(dir, "live.raw"), checkpoints: map[string]int{}}
	if err := run(ctx, "qemu-img", "create", "-q", "-f", "raw", h.live, fmt.Sprint(size)); err != nil {
		return nil, err
	}
	return h, nil
}

// Live is the live disk's path.
func (h *Hypervisor) Live() string { return h.live }

// Write fills length bytes at offset of the live disk with pattern, as a
// guest would.
func (h *Hypervisor) Write(ctx context.Context, offset, length int64, pattern byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := qemuIOWrite(ctx, "raw", h.live, write{offset, length, pattern}); err != nil {
		return err
	}
	h.writes = append(h.writes, write{offset, length, pattern})
	return nil
}

// Snapshot copies the live disk to path, for comparing a restore with.
func (h *Hypervisor) Snapshot(ctx context.Context, path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return run(ctx, "cp", "--sparse=always", h.live, path)
}

// Forget drops a checkpoint, as a hypervisor that lost its bitmaps would.
func (h *Hypervisor) Forget(checkpoint string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.checkpoints, checkpoint)
}

// Checkpoints implements backup.Hypervisor.
func (h *Hypervisor) Checkpoints(context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, c := range h.order {
		if _, ok := h.checkpoints[c]; ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// Backup implements backup.Hypervisor.
func (h *Hypervisor) Backup(ctx context.Context, checkpoint, parent, dir string) (map[string]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	file := filepath.Join(dir, checkpoint+"-"+h.Disk+".qcow2")
	if parent == "" {
		if err := run(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", h.live, file); err != nil {
			return nil, err
		}
	} else {
		since, ok := h.checkpoints[parent]
		if !ok {
			return nil, fmt.Errorf("checkpoint %s unknown to the hypervisor", parent)
		}
		if err := run(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", h.live, file); err != nil {
			return nil, err
		}
		for _, w := range h.writes[since:] {
			if err := qemuIOWrite(ctx, "qcow2", file, w); err != nil {
				return nil, err
			}
		}
	}
	h.checkpoints[checkpoint] = len(h.writes)
	h.order = append(h.order, checkpoint)
	return map[string]string{h.Disk: file}, nil
}

func qemuIOWrite(ctx context.Context, format, path string, w write) error {
	return run(ctx, "qemu-io", "-f", format, "-c", fmt.Sprintf("write -P 0x%02x %d %d", w.pattern, w.offset, w.length), path)
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Cleanup removes the live disk.
func (h *Hypervisor) Cleanup() error { return os.Remove(h.live) }
