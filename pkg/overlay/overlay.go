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

// Package overlay makes sure a qcow2 overlay exists over a backing image:
// it creates one atomically, or validates an existing persistent one before
// it is reused, and removes ephemeral ones.
//
// Every overlay has a creation record beside it (a small JSON file) naming
// its backing and the backing's identity when the overlay was made. An
// overlay is only reused when its header still names the same backing and
// format, its metadata is clean, and the backing's identity is unchanged:
// an overlay over a changed backing would show the guest garbage, and a
// silent re-create would lose the guest's data, so both are refused with
// an error that says why.
package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// RecordSuffix names an overlay's creation record: <overlay><RecordSuffix>.
const RecordSuffix = ".overlay.json"

var (
	// ErrBackingChanged means the backing is not the image the overlay was
	// created over.
	ErrBackingChanged = errors.New("backing image changed since the overlay was created")
	// ErrInvalidOverlay means an existing overlay cannot be trusted.
	ErrInvalidOverlay = errors.New("existing overlay cannot be trusted")
)

// Backing is the image an overlay reads through.
type Backing struct {
	// Path is the backing as QEMU opens it; the overlay records it.
	Path string
	// Format is qcow2.FormatRaw or qcow2.FormatQcow2.
	Format string
	// LocalPath is where this process reads the backing when it sees
	// another mount layout than QEMU (a sidecar container); empty means
	// Path.
	LocalPath string
}

func (b Backing) local() string {
	if b.LocalPath != "" {
		return b.LocalPath
	}
	return b.Path
}

// Spec describes one overlay.
type Spec struct {
	// Path is where this process creates or finds the overlay: a regular
	// file (made under a temporary name in the same directory, then
	// renamed) or a block device (written in place).
	Path    string
	Backing Backing
	// Persistent overlays are kept and reused; ephemeral ones are reused
	// only while their directory lives (the same pod) and are removed by
	// Remove.
	Persistent bool
	// Size of the overlay in bytes; 0 takes the backing's virtual size.
	Size    int64
	Options CreateOptions
	// Identity is how a new overlay fingerprints its backing
	// (IdentitySampled when empty). An existing overlay is verified with
	// the method it was created with.
	Identity string
	// RecordPath is the creation record; Path+RecordSuffix when empty.
	// Required when Path is a block device.
	RecordPath string
	// InUse says a running QEMU has the overlay open (the target of a live
	// migration): it is validated without a metadata check, which would
	// race with the writer, and never created.
	InUse bool
}

func (s Spec) recordPath() string {
	if s.RecordPath != "" {
		return s.RecordPath
	}
	return s.Path + RecordSuffix
}

// Record is an overlay's creation record.
type Record struct {
	Version  int      `json:"version"`
	Backing  Backing  `json:"backing"`
	Size     int64    `json:"size"`
	Identity Identity `json:"identity"`
}

// Result says what Ensure did.
type Result struct {
	// Created is true for a new overlay, false for a validated one.
	Created bool
	Record  Record
}

// Manager ensures overlays with an image tool.
type Manager struct {
	Images Images
}

// Ensure creates the overlay spec describes, or validates the existing one.
func (m Manager) Ensure(ctx context.Context, spec Spec) (*Result, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("ensure overlay %s: %w", spec.Path, err)
	}
	exists, err := spec.exists()
	if err != nil {
		return nil, fmt.Errorf("ensure overlay %s: %w", spec.Path, err)
	}
	if exists {
		rec, err := m.validate(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("ensure overlay %s: %w", spec.Path, err)
		}
		return &Result{Record: *rec}, nil
	}
	if spec.InUse {
		return nil, fmt.Errorf("ensure overlay %s: %w: it does not exist although QEMU is said to use it", spec.Path, ErrInvalidOverlay)
	}
	rec, err := m.create(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("create overlay %s: %w", spec.Path, err)
	}
	return &Result{Created: true, Record: *rec}, nil
}

func (s Spec) validate() error {
	if !filepath.IsAbs(s.Path) {
		return fmt.Errorf("overlay path %q is not absolute", s.Path)
	}
	if !filepath.IsAbs(s.Backing.Path) || !filepath.IsAbs(s.Backing.local()) {
		return fmt.Errorf("backing path %q is not absolute", s.Backing.Path)
	}
	if s.Backing.Format != qcow2.FormatRaw && s.Backing.Format != qcow2.FormatQcow2 {
		return fmt.Errorf("unsupported backing format %q", s.Backing.Format)
	}
	if s.Identity != "" && s.Identity != IdentitySampled && s.Identity != IdentityFull {
		return fmt.Errorf("unknown identity method %q", s.Identity)
	}
	if blockdev.Is(s.Path) && s.RecordPath == "" {
		return fmt.Errorf("an overlay on a block device needs a record path")
	}
	return nil
}

// exists reports whether an overlay is there to validate. A block device
// always exists; it holds an overlay once its creation record does.
func (s Spec) exists() (bool, error) {
	fi, err := os.Lstat(s.Path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case fi.Mode().IsRegular():
		return true, nil
	case blockdev.Is(s.Path):
		_, err := os.Stat(s.recordPath())
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	default:
		return false, fmt.Errorf("%w: %s is neither a regular file nor a block device", ErrInvalidOverlay, s.Path)
	}
}

func (m Manager) validate(ctx context.Context, spec Spec) (*Record, error) {
	h, err := m.Images.Inspect(ctx, spec.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOverlay, err)
	}
	switch {
	case h.Format != qcow2.FormatQcow2:
		return nil, fmt.Errorf("%w: format is %q, not qcow2", ErrInvalidOverlay, h.Format)
	case h.BackingFile != spec.Backing.Path:
		return nil, fmt.Errorf("%w: it names backing %q, expected %q", ErrInvalidOverlay, h.BackingFile, spec.Backing.Path)
	case h.BackingFormat != spec.Backing.Format:
		return nil, fmt.Errorf("%w: it names backing format %q, expected %q", ErrInvalidOverlay, h.BackingFormat, spec.Backing.Format)
	case h.DataFile != "":
		return nil, fmt.Errorf("%w: it has an external data file %q", ErrInvalidOverlay, h.DataFile)
	case h.Corrupt:
		return nil, fmt.Errorf("%w: QEMU marked it corrupt", ErrInvalidOverlay)
	}
	if !spec.InUse {
		res, err := m.Images.Check(ctx, spec.Path)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOverlay, err)
		}
		if !res.Clean {
			return nil, fmt.Errorf("%w: metadata check failed: %s", ErrInvalidOverlay, res.Detail)
		}
	}
	rec, err := readRecord(spec.recordPath())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOverlay, err)
	}
	if rec.Backing.Path != spec.Backing.Path || rec.Backing.Format != spec.Backing.Format {
		return nil, fmt.Errorf("%w: its record names backing %s (%s), expected %s (%s)", ErrInvalidOverlay,
			rec.Backing.Path, rec.Backing.Format, spec.Backing.Path, spec.Backing.Format)
	}
	now, err := Identify(ctx, spec.Backing.local(), rec.Identity.Method)
	if err != nil {
		return nil, err
	}
	if now != rec.Identity {
		return nil, fmt.Errorf("%w: backing %s was %d bytes %s, is %d bytes %s", ErrBackingChanged,
			spec.Backing.Path, rec.Identity.Size, rec.Identity.Digest, now.Size, now.Digest)
	}
	return rec, nil
}

func (m Manager) create(ctx context.Context, spec Spec) (*Record, error) {
	local := spec.Backing.local()
	if _, err := os.Stat(local); err != nil {
		return nil, fmt.Errorf("backing: %w", err)
	}
	size := spec.Size
	if size == 0 {
		var err error
		if size, err = m.Images.VirtualSize(ctx, local, spec.Backing.Format); err != nil {
			return nil, fmt.Errorf("size of backing: %w", err)
		}
	}
	method := spec.Identity
	if method == "" {
		method = IdentitySampled
	}
	id, err := Identify(ctx, local, method)
	if err != nil {
		return nil, err
	}
	backing := spec.Backing
	backing.LocalPath = ""
	rec := &Record{Version: 1, Backing: backing, Size: size, Identity: id}

	if blockdev.Is(spec.Path) {
		// In place; the record, written last, marks the device as holding
		// a trusted overlay.
		if err := m.Images.CreateOverlay(ctx, spec.Path, spec.Backing, size, spec.Options); err != nil {
			return nil, err
		}
		res, err := m.Images.Check(ctx, spec.Path)
		if err != nil {
			return nil, err
		}
		if !res.Clean {
			return nil, fmt.Errorf("new overlay fails its check: %s", res.Detail)
		}
		return rec, writeFileAtomic(spec.recordPath(), rec)
	}

	dir := filepath.Dir(spec.Path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(spec.Path)+".creating-")
	if err != nil {
		return nil, err
	}
	tmpPath := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpPath)
	// qemu-img refuses to create over an existing file it did not make.
	if err := os.Remove(tmpPath); err != nil {
		return nil, err
	}
	if err := m.Images.CreateOverlay(ctx, tmpPath, spec.Backing, size, spec.Options); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmpPath, 0o660); err != nil {
		return nil, err
	}
	// The record first, then the overlay: an interrupted create leaves at
	// most a record without an overlay, which the next create replaces.
	if err := writeFileAtomic(spec.recordPath(), rec); err != nil {
		return nil, err
	}
	if err := os.Rename(tmpPath, spec.Path); err != nil {
		return nil, err
	}
	return rec, syncDir(dir)
}

// Remove deletes an ephemeral overlay and its record; a missing one is not
// an error. Persistent overlays are refused: they hold a VM's data.
func (m Manager) Remove(spec Spec) error {
	if spec.Persistent {
		return fmt.Errorf("remove overlay %s: refusing to remove a persistent overlay", spec.Path)
	}
	if blockdev.Is(spec.Path) {
		return fmt.Errorf("remove overlay %s: refusing to remove a block device", spec.Path)
	}
	for _, p := range []string{spec.Path, spec.recordPath()} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove overlay %s: %w", spec.Path, err)
		}
	}
	return nil
}

func readRecord(path string) (*Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("creation record: %w", err)
	}
	rec := &Record{}
	if err := json.Unmarshal(data, rec); err != nil {
		return nil, fmt.Errorf("creation record %s: %w", path, err)
	}
	if rec.Version != 1 {
		return nil, fmt.Errorf("creation record %s: unsupported version %d", path, rec.Version)
	}
	return rec, nil
}

// writeFileAtomic writes v as JSON to a temporary file beside path, syncs
// it and renames it into place.
func writeFileAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o640); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
