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
	"fmt"
	"os"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

// The loop devices of the tests are internal/blockdev's, the same code the
// CSI driver and the thin-provisioning extender run; ctx is kept for the
// callers, the ioctls do not block.

// AttachLoop attaches a file to a free loop device and returns the device.
func AttachLoop(_ context.Context, file string) (string, error) {
	return blockdev.AttachLoop(file, false)
}

// DetachLoop detaches a loop device.
func DetachLoop(_ context.Context, dev string) error {
	return blockdev.DetachLoop(dev)
}

// GrowLoop grows the file behind a loop device to size bytes and makes the
// device, and a QEMU using it, see the new size: online, no QMP call.
func GrowLoop(_ context.Context, dev, file string, size int64) error {
	if err := os.Truncate(file, size); err != nil {
		return fmt.Errorf("grow loop device %s: %w", dev, err)
	}
	_, err := blockdev.RefreshLoopCapacity(dev)
	return err
}

// DeviceSize is the size in bytes of a block device (or file).
func DeviceSize(path string) (int64, error) {
	return blockdev.Size(path)
}

// CreateLoopFile creates a sparse file of size bytes and attaches it to a
// loop device, returning the device.
func CreateLoopFile(ctx context.Context, file string, size int64) (string, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("create loop file: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return "", fmt.Errorf("create loop file %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("create loop file %s: %w", file, err)
	}
	return AttachLoop(ctx, file)
}
