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

// Package qcow2 drives qemu-img for what this project does with qcow2
// images: overlays over a backing image, inspection, consistency checks,
// sizing, and rebuilding a chain. Processes without qemu-img read and write
// qcow2 metadata in Go through pkg/qcow2meta.
package qcow2

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

// Formats a backing image may have.
const (
	FormatRaw   = "raw"
	FormatQcow2 = "qcow2"
)

// Tool runs qemu-img. The zero value runs the qemu-img found on PATH.
type Tool struct {
	// Exec runs qemu-img with args and returns its standard output; the
	// error of a failed run carries its standard error. Tests replace it.
	Exec func(ctx context.Context, args ...string) ([]byte, error)
}

func (t Tool) run(ctx context.Context, args ...string) ([]byte, error) {
	if t.Exec != nil {
		return t.Exec(ctx, args...)
	}
	return execQemuImg(ctx, args...)
}

// ExitError is a qemu-img run that exited non-zero.
type ExitError struct {
	Args   []string
	Code   int
	Stderr string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("qemu-img %s: exit status %d: %s", strings.Join(e.Args, " "), e.Code, e.Stderr)
}

func execQemuImg(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "qemu-img", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return stdout.Bytes(), &ExitError{Args: args, Code: exitErr.ExitCode(), Stderr: strings.TrimSpace(stderr.String())}
	}
	if err != nil {
		return nil, fmt.Errorf("qemu-img %s: %w", strings.Join(args, " "), err)
	}
	return stdout.Bytes(), nil
}

// Info is what `qemu-img info --output=json` reports about one image.
type Info struct {
	Filename            string `json:"filename"`
	Format              string `json:"format"`
	VirtualSize         int64  `json:"virtual-size"`
	ActualSize          int64  `json:"actual-size"`
	ClusterSize         int64  `json:"cluster-size"`
	BackingFilename     string `json:"backing-filename"`
	FullBackingFilename string `json:"full-backing-filename"`
	BackingFormat       string `json:"backing-filename-format"`
	DirtyFlag           bool   `json:"dirty-flag"`
	FormatSpecific      struct {
		Type string `json:"type"`
		Data struct {
			DataFile      string `json:"data-file"`
			ExtendedL2    bool   `json:"extended-l2"`
			LazyRefcounts bool   `json:"lazy-refcounts"`
			Corrupt       bool   `json:"corrupt"`
		} `json:"data"`
	} `json:"format-specific"`
}

// InfoOptions select how an image is opened for inspection.
type InfoOptions struct {
	// Format skips probing; set it for images whose format is known.
	Format string
	// Shared opens the image without taking locks (-U), for images a
	// running QEMU holds.
	Shared bool
	// NoBacking opens the image alone: its backing file is recorded but not
	// opened, for layers whose backing is not where the header says.
	NoBacking bool
}

// args builds a qemu-img subcommand that opens path as opts say.
func (o InfoOptions) args(subcommand, path string) []string {
	args := []string{subcommand, "--output=json"}
	if o.Shared {
		args = append(args, "-U")
	}
	if o.NoBacking {
		return append(args, WithoutBacking(path, o.Format))
	}
	if o.Format != "" {
		args = append(args, "-f", o.Format)
	}
	return append(args, path)
}

// Info inspects one image.
func (t Tool) Info(ctx context.Context, path string, opts InfoOptions) (*Info, error) {
	out, err := t.run(ctx, opts.args("info", path)...)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", path, err)
	}
	info := &Info{}
	if err := json.Unmarshal(out, info); err != nil {
		return nil, fmt.Errorf("inspect %s: parse qemu-img output: %w", path, err)
	}
	return info, nil
}

// WithoutBacking names an image (file or block device) so that qemu-img and
// qemu-io open it alone: its backing file is recorded but not opened. An
// empty format means qcow2.
func WithoutBacking(path, format string) string {
	if format == "" {
		format = FormatQcow2
	}
	protocol := "file"
	if blockdev.Is(path) {
		protocol = "host_device"
	}
	spec, _ := json.Marshal(map[string]any{
		"driver":  format,
		"backing": nil,
		"file":    map[string]string{"driver": protocol, "filename": path},
	})
	return "json:" + string(spec)
}

// CreateOptions tune a new qcow2 image. Zero values take qemu-img's defaults.
type CreateOptions struct {
	// Size in bytes; 0 takes the backing image's virtual size.
	Size          int64
	ClusterSize   int64
	ExtendedL2    bool
	LazyRefcounts bool
}

func (o CreateOptions) qemuOptions() string {
	var opts []string
	if o.ClusterSize > 0 {
		opts = append(opts, "cluster_size="+strconv.FormatInt(o.ClusterSize, 10))
	}
	if o.ExtendedL2 {
		opts = append(opts, "extended_l2=on")
	}
	if o.LazyRefcounts {
		opts = append(opts, "lazy_refcounts=on")
	}
	return strings.Join(opts, ",")
}

// CreateOverlay makes a qcow2 image at path whose backing is backing (an
// absolute path, opened read-only by QEMU) in backingFormat.
//
// A regular file is made under a temporary name in the same directory,
// synced and renamed into place, so an interrupted create never leaves an
// image at path that a later start would trust. A block device is written
// in place: its header is only trusted once Check passes.
func (t Tool) CreateOverlay(ctx context.Context, path, backing, backingFormat string, opts CreateOptions) error {
	if !filepath.IsAbs(backing) {
		return fmt.Errorf("create overlay %s: backing path %q is not absolute", path, backing)
	}
	if backingFormat != FormatRaw && backingFormat != FormatQcow2 {
		return fmt.Errorf("create overlay %s: unsupported backing format %q", path, backingFormat)
	}
	args := []string{"create", "-q", "-f", FormatQcow2, "-b", backing, "-F", backingFormat}
	if o := opts.qemuOptions(); o != "" {
		args = append(args, "-o", o)
	}
	if blockdev.Is(path) {
		args = append(args, path)
		if opts.Size > 0 {
			args = append(args, strconv.FormatInt(opts.Size, 10))
		}
		if _, err := t.run(ctx, args...); err != nil {
			return fmt.Errorf("create overlay %s: %w", path, err)
		}
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpPath)
	args = append(args, tmpPath)
	if opts.Size > 0 {
		args = append(args, strconv.FormatInt(opts.Size, 10))
	}
	if _, err := t.run(ctx, args...); err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	if err := syncFile(tmpPath); err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	if err := os.Rename(tmpPath, path); err != nil {
		return fmt.Errorf("create overlay %s: %w", path, err)
	}
	return syncFile(filepath.Dir(path))
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// CheckResult is what `qemu-img check --output=json` reports.
type CheckResult struct {
	CheckErrors      int   `json:"check-errors"`
	Corruptions      int   `json:"corruptions"`
	Leaks            int   `json:"leaks"`
	ImageEndOffset   int64 `json:"image-end-offset"`
	TotalClusters    int64 `json:"total-clusters"`
	AllocatedCluster int64 `json:"allocated-clusters"`
}

// Clean reports whether the image has no errors, corruptions or leaks.
func (r *CheckResult) Clean() bool {
	return r.CheckErrors == 0 && r.Corruptions == 0 && r.Leaks == 0
}

// Check verifies a qcow2 image's metadata. A corrupt image is not an error
// of Check: it returns a result that is not Clean.
func (t Tool) Check(ctx context.Context, path string, opts InfoOptions) (*CheckResult, error) {
	out, err := t.run(ctx, opts.args("check", path)...)
	var exitErr *ExitError
	// Exit 2 (corruptions) and 3 (leaks) still print a report.
	if err != nil && !(errors.As(err, &exitErr) && (exitErr.Code == 2 || exitErr.Code == 3) && len(out) > 0) { //nolint:staticcheck // reads as "unless the report was printed"
		return nil, fmt.Errorf("check %s: %w", path, err)
	}
	res := &CheckResult{}
	if err := json.Unmarshal(out, res); err != nil {
		return nil, fmt.Errorf("check %s: parse qemu-img output: %w", path, err)
	}
	return res, nil
}

// Measure returns the bytes a qcow2 image of virtual size bytes needs when
// every cluster is allocated, metadata included.
func (t Tool) Measure(ctx context.Context, size int64, opts CreateOptions) (int64, error) {
	args := []string{"measure", "--output=json", "-O", FormatQcow2}
	if o := opts.qemuOptions(); o != "" {
		args = append(args, "-o", o)
	}
	out, err := t.run(ctx, append(args, "--size", strconv.FormatInt(size, 10))...)
	if err != nil {
		return 0, fmt.Errorf("measure qcow2 of %d bytes: %w", size, err)
	}
	var m struct {
		FullyAllocated int64 `json:"fully-allocated"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return 0, fmt.Errorf("measure qcow2 of %d bytes: parse qemu-img output: %w", size, err)
	}
	return m.FullyAllocated, nil
}

// Rebase points a qcow2 image at a new backing without touching data
// (`rebase -u`): for rebuilding a chain whose layers were written against
// other paths.
func (t Tool) Rebase(ctx context.Context, path, backing, backingFormat string) error {
	if _, err := t.run(ctx, "rebase", "-u", "-f", FormatQcow2, "-F", backingFormat, "-b", backing, path); err != nil {
		return fmt.Errorf("rebase %s onto %s: %w", path, backing, err)
	}
	return nil
}

// Convert copies the guest-visible content of src (through its backing
// chain) into dst in dstFormat. An existing dst, such as a block device, is
// written in place rather than created. A raw dst is written out of order
// (-W): every write lands at its own offset whatever the order, and
// qemu-img's writers no longer wait for each other.
func (t Tool) Convert(ctx context.Context, src, srcFormat, dst, dstFormat string) error {
	args := []string{"convert", "-q", "-f", srcFormat, "-O", dstFormat}
	if blockdev.Is(dst) {
		args = append(args, "-n")
	}
	if dstFormat == FormatRaw {
		args = append(args, "-W")
	}
	if _, err := t.run(ctx, append(args, src, dst)...); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src, dst, err)
	}
	return nil
}

// Compare reports whether two images show the guest the same content. An
// empty format lets qemu-img probe it; name it for raw images, whose first
// bytes may look like another format's header.
func (t Tool) Compare(ctx context.Context, a, aFormat, b, bFormat string) (bool, error) {
	args := []string{"compare", "-q"}
	if aFormat != "" {
		args = append(args, "-f", aFormat)
	}
	if bFormat != "" {
		args = append(args, "-F", bFormat)
	}
	_, err := t.run(ctx, append(args, a, b)...)
	var exitErr *ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &exitErr) && exitErr.Code == 1:
		return false, nil
	default:
		return false, fmt.Errorf("compare %s with %s: %w", a, b, err)
	}
}
