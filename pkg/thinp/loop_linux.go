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
	"fmt"
	"os"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

// LoopExtender grows a loop device by growing its backing file and telling
// the loop driver to read the file's new size (LOOP_SET_CAPACITY). Readers
// of the device, QEMU among them, see the new size at once.
type LoopExtender struct {
	// Device is the loop device, e.g. /dev/loop3.
	Device string
	// BackingFile is the file behind Device.
	BackingFile string
}

// NewLoopExtender makes a LoopExtender for device, finding its backing
// file in sysfs.
func NewLoopExtender(device string) (*LoopExtender, error) {
	file, err := blockdev.LoopBackingFile(device)
	if err != nil {
		return nil, err
	}
	return &LoopExtender{Device: device, BackingFile: file}, nil
}

// Extend grows the backing file to size and the device with it.
func (l *LoopExtender) Extend(ctx context.Context, size int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("extend %s: %w", l.Device, err)
	}
	fi, err := os.Stat(l.BackingFile)
	if err != nil {
		return 0, fmt.Errorf("extend %s: %w", l.Device, err)
	}
	if fi.Size() < size {
		if err := os.Truncate(l.BackingFile, size); err != nil {
			return 0, fmt.Errorf("extend %s: grow %s: %w", l.Device, l.BackingFile, err)
		}
	}
	got, err := blockdev.RefreshLoopCapacity(l.Device)
	if err != nil {
		return 0, fmt.Errorf("extend %s: %w", l.Device, err)
	}
	return got, nil
}
