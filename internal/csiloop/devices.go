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

package csiloop

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
)

// Loops attaches volume files to loop devices. The driver uses the
// kernel's (internal/blockdev); unit tests, which run without root, use a
// fake of their own besides the functional suite's real devices.
type Loops interface {
	// Attach binds file to a free loop device and returns the device.
	Attach(file string, readOnly bool) (string, error)
	// Detach unbinds a loop device; an unbound one is no error.
	Detach(dev string) error
	// Backs reports whether dev is bound to file itself (its inode).
	Backs(dev, file string) (bool, error)
	// Find returns the loop devices bound to file, on every node.
	Find(file string) ([]string, error)
	// RefreshCapacity makes dev take its file's size and returns it.
	RefreshCapacity(dev string) (int64, error)
}

// Mounter publishes a device node at a path kubelet gives.
type Mounter interface {
	// BindDevice bind-mounts the device node dev onto the file target.
	BindDevice(dev, target string, readOnly bool) error
	// IsMountOf reports whether target is dev's device node mounted there.
	IsMountOf(dev, target string) (bool, error)
	// Unmount unmounts whatever is mounted at target; a path that is not
	// a mount point, or no path, is no error.
	Unmount(target string) error
}

// kernelLoops are the kernel's loop devices.
type kernelLoops struct{}

func (kernelLoops) Attach(file string, readOnly bool) (string, error) {
	return blockdev.AttachLoop(file, readOnly)
}

func (kernelLoops) Detach(dev string) error { return blockdev.DetachLoop(dev) }

func (kernelLoops) Backs(dev, file string) (bool, error) { return blockdev.LoopBacks(dev, file) }

func (kernelLoops) Find(file string) ([]string, error) { return blockdev.FindLoops(file) }

func (kernelLoops) RefreshCapacity(dev string) (int64, error) {
	return blockdev.RefreshLoopCapacity(dev)
}

// kernelMounter makes bind mounts with mount(2). With /var/lib/kubelet
// mounted into the driver's container with Bidirectional propagation, they
// appear on the node where kubelet looks.
type kernelMounter struct{}

func (kernelMounter) BindDevice(dev, target string, readOnly bool) error {
	if err := unix.Mount(dev, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", dev, target, err)
	}
	if !readOnly {
		return nil
	}
	// A bind mount takes MS_RDONLY only when remounted.
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		_ = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		return fmt.Errorf("make the mount of %s on %s read-only: %w", dev, target, err)
	}
	return nil
}

func (kernelMounter) IsMountOf(dev, target string) (bool, error) {
	var want, got unix.Stat_t
	if err := unix.Stat(dev, &want); err != nil {
		return false, fmt.Errorf("is %s mounted on %s: %w", dev, target, err)
	}
	if err := unix.Lstat(target, &got); errors.Is(err, unix.ENOENT) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("is %s mounted on %s: %w", dev, target, err)
	}
	// The file made for the mount is a regular file; with the device
	// bound over it, the path is the device node.
	return got.Mode&unix.S_IFMT == unix.S_IFBLK && got.Rdev == want.Rdev, nil
}

func (kernelMounter) Unmount(target string) error {
	// Mounts stacked by repeated publishing come off one by one.
	for {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
}

// removeTarget removes the file the driver made at a publish target.
func removeTarget(target string) error {
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", target, err)
	}
	return nil
}
