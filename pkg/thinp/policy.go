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

package thinp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

const (
	// DefaultChunkSize is what a disk grows by in one extension.
	DefaultChunkSize int64 = 1 << 30
	// DefaultPollInterval is how often a Monitor reads every disk's
	// allocation in case a threshold event went missing.
	DefaultPollInterval = 2 * time.Second
	// DefaultVerifyTimeout bounds the wait for QEMU to see a new size.
	DefaultVerifyTimeout = 30 * time.Second
	// sizeAlignment is what device sizes are rounded up to.
	sizeAlignment int64 = 1 << 20
)

// ResumeBehavior says what a Monitor does with a domain it finds paused
// because a monitored disk ran out of space, once the disk is extended.
type ResumeBehavior int

const (
	// AutoResume resumes the domain.
	AutoResume ResumeBehavior = iota
	// LeavePaused extends the disk but leaves the domain paused for an
	// operator or a higher-level controller to resume.
	LeavePaused
)

// Policy decides when and by how much a disk grows. The zero value is the
// default policy.
type Policy struct {
	// ChunkSize is the growth of one extension; 0 means DefaultChunkSize.
	ChunkSize int64
	// FreeThreshold is the free space (physical size minus allocation)
	// below which the disk is extended; 0 means half a chunk. It must be
	// smaller than ChunkSize.
	FreeThreshold int64
	// PollInterval is the period of the fallback poll; 0 means
	// DefaultPollInterval.
	PollInterval time.Duration
	// VerifyTimeout bounds the wait for QEMU to see an extension; 0 means
	// DefaultVerifyTimeout.
	VerifyTimeout time.Duration
	// Resume is what happens after an ENOSPC pause.
	Resume ResumeBehavior
}

// WithDefaults returns the policy with every zero field set to its default.
func (p Policy) WithDefaults() Policy {
	if p.ChunkSize == 0 {
		p.ChunkSize = DefaultChunkSize
	}
	if p.FreeThreshold == 0 {
		p.FreeThreshold = p.ChunkSize / 2
	}
	if p.PollInterval == 0 {
		p.PollInterval = DefaultPollInterval
	}
	if p.VerifyTimeout == 0 {
		p.VerifyTimeout = DefaultVerifyTimeout
	}
	return p
}

// Validate refuses a policy that could not keep a disk ahead of its guest.
func (p Policy) Validate() error {
	p = p.WithDefaults()
	switch {
	case p.ChunkSize < sizeAlignment:
		return fmt.Errorf("thin-provisioning policy: chunk size %d is below the minimum %d", p.ChunkSize, sizeAlignment)
	case p.FreeThreshold < 0:
		return fmt.Errorf("thin-provisioning policy: free threshold %d is negative", p.FreeThreshold)
	case p.FreeThreshold >= p.ChunkSize:
		// An extension would leave less free space than the threshold
		// and the disk would be exceeded again at once.
		return fmt.Errorf("thin-provisioning policy: free threshold %d is not below the chunk size %d", p.FreeThreshold, p.ChunkSize)
	case p.PollInterval < 0 || p.VerifyTimeout < 0:
		return errors.New("thin-provisioning policy: negative interval")
	case p.Resume != AutoResume && p.Resume != LeavePaused:
		return fmt.Errorf("thin-provisioning policy: unknown resume behavior %d", p.Resume)
	}
	return nil
}

// Usage is what libvirt reports about the image on a block device:
// Allocation is the highest offset the image has written, Physical the
// size of the device, Capacity the guest-visible (virtual) size.
type Usage struct {
	Allocation int64
	Physical   int64
	Capacity   int64
}

// Free is the room left on the device.
func (u Usage) Free() int64 {
	return u.Physical - u.Allocation
}

// ImprobableAllocationError is an allocation report that cannot be true:
// acting on it could grow a device without bound, so the Monitor refuses.
type ImprobableAllocationError struct {
	Usage   Usage
	Maximum int64
	Reason  string
}

func (e *ImprobableAllocationError) Error() string {
	return fmt.Sprintf("improbable allocation %d (physical %d, maximum %d): %s",
		e.Usage.Allocation, e.Usage.Physical, e.Maximum, e.Reason)
}

// CheckAllocation refuses allocation reports no real image can produce:
// past the size of the fully allocated image. One past the end of the
// device is what a write that failed with ENOSPC leaves (QEMU's
// wr_highest_offset counts the end of every write, failed or not), and
// what the extension is for; NextSize grows past it.
func CheckAllocation(u Usage, maximum int64) error {
	var reason string
	switch {
	case u.Allocation < 0 || u.Physical < 0:
		reason = "negative size"
	case maximum > 0 && u.Allocation > maximum:
		reason = "beyond the fully allocated image size"
	default:
		return nil
	}
	return &ImprobableAllocationError{Usage: u, Maximum: maximum, Reason: reason}
}

// NeedsExtension reports whether the free space fell below the threshold
// and the device is not yet at its maximum.
func (p Policy) NeedsExtension(u Usage, maximum int64) bool {
	p = p.WithDefaults()
	return u.Physical < maximum && u.Free() < p.FreeThreshold
}

// Threshold is the allocation at which libvirt should report the disk:
// the device size minus the free threshold.
func (p Policy) Threshold(physical int64) uint64 {
	p = p.WithDefaults()
	if t := physical - p.FreeThreshold; t > 0 {
		return uint64(t)
	}
	return 0
}

// NextSize is the size to grow a device to: one chunk above the larger of
// the device size and the allocation, so that after the extension the
// free space is at least a chunk (more than the threshold), rounded up to
// a MiB and capped at maximum.
func (p Policy) NextSize(u Usage, maximum int64) int64 {
	p = p.WithDefaults()
	base := max(u.Physical, u.Allocation)
	next := alignUp(base+p.ChunkSize, sizeAlignment)
	if maximum > 0 && next > maximum {
		next = maximum
	}
	return max(next, u.Physical)
}

// MaximumSize is the largest a device holding a qcow2 image of virtualSize
// bytes ever needs to be: the fully allocated image with its metadata, as
// `qemu-img measure` computes it for the image's creation options, rounded
// up to a MiB.
func MaximumSize(ctx context.Context, tool qcow2.Tool, virtualSize int64, opts qcow2.CreateOptions) (int64, error) {
	if virtualSize <= 0 {
		return 0, fmt.Errorf("maximum size of a %d-byte qcow2 image: virtual size must be positive", virtualSize)
	}
	full, err := tool.Measure(ctx, virtualSize, opts)
	if err != nil {
		return 0, fmt.Errorf("maximum size of a %d-byte qcow2 image: %w", virtualSize, err)
	}
	return alignUp(full, sizeAlignment), nil
}

func alignUp(n, to int64) int64 {
	return (n + to - 1) / to * to
}

// MaximumSizeOf is MaximumSize for the qcow2 image at path (a block
// device a running QEMU may hold): its virtual size and cluster layout are
// read from the image.
func MaximumSizeOf(ctx context.Context, tool qcow2.Tool, path string) (int64, error) {
	info, err := tool.Info(ctx, path, qcow2.InfoOptions{Format: qcow2.FormatQcow2, Shared: true})
	if err != nil {
		return 0, fmt.Errorf("maximum size of %s: %w", path, err)
	}
	return MaximumSize(ctx, tool, info.VirtualSize, qcow2.CreateOptions{
		ClusterSize: info.ClusterSize,
		ExtendedL2:  info.FormatSpecific.Data.ExtendedL2,
	})
}
