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

package blockdev

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Loop devices are driven through the kernel's ioctls, as losetup does, so
// that a program using them needs no util-linux: a container image of one
// static binary attaches, grows and detaches them.

// loopControl is the loop driver's control device, which hands out free
// loop devices.
const loopControl = "/dev/loop-control"

// attachAttempts bounds the retries when another process binds the free
// device this one was handed before this one could.
const attachAttempts = 16

// AttachLoop binds file to a free loop device and returns the device, e.g.
// /dev/loop3. A read-only device refuses writes. The device stays bound
// until DetachLoop, whoever opens or closes it meanwhile.
func AttachLoop(file string, readOnly bool) (string, error) {
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	backing, err := os.OpenFile(file, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("attach %s to a loop device: %w", file, err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile(loopControl, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("attach %s to a loop device: %w", file, err)
	}
	defer ctl.Close()

	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	copy(cfg.Info.File_name[:unix.LO_NAME_SIZE-1], file)
	if readOnly {
		cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY
	}
	for range attachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("attach %s to a loop device: find a free one: %w", file, err)
		}
		dev := LoopPath(n)
		err = configure(dev, flags, &cfg)
		if errors.Is(err, unix.EBUSY) {
			continue // taken since LOOP_CTL_GET_FREE: ask again
		}
		if err != nil {
			return "", fmt.Errorf("attach %s to %s: %w", file, dev, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("attach %s to a loop device: every free device was taken first %d times", file, attachAttempts)
}

// configure binds the backing file of cfg to dev.
func configure(dev string, flags int, cfg *unix.LoopConfig) error {
	f, err := os.OpenFile(dev, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlLoopConfigure(int(f.Fd()), cfg)
}

// LoopPath is the device node of loop device n.
func LoopPath(n int) string {
	return "/dev/loop" + strconv.Itoa(n)
}

// DetachLoop unbinds a loop device from its file. A device still open
// elsewhere (by QEMU, say) is unbound by the kernel when its last user
// closes it. An unbound device is no error.
func DetachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("detach loop device %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach loop device %s: %w", dev, err)
	}
	return nil
}

// RefreshLoopCapacity makes a loop device take the current size of its
// file (LOOP_SET_CAPACITY) and returns the device's size in bytes. Readers
// of the device, QEMU among them, see the new size at once: this is how a
// loop device grows online.
func RefreshLoopCapacity(dev string) (int64, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("refresh the capacity of %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return 0, fmt.Errorf("refresh the capacity of %s: LOOP_SET_CAPACITY: %w", dev, err)
	}
	size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return 0, fmt.Errorf("refresh the capacity of %s: read the device's size: %w", dev, err)
	}
	return int64(size), nil
}

// LoopBackingFile is the path of the file behind a bound loop device, as
// the kernel recorded it at attach time (from sysfs).
func LoopBackingFile(dev string) (string, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return "", fmt.Errorf("find the backing file of %s: %w", dev, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// LoopBacks reports whether dev is a loop device bound to file itself: the
// same inode on the same filesystem, whatever path either was named by.
// An unbound device, a missing one, and one being detached (unbound when
// its last user closes it) back nothing.
func LoopBacks(dev, file string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return false, fmt.Errorf("is %s bound to %s: %w", dev, file, err)
	}
	return backs(dev, &st)
}

func backs(dev string, file *unix.Stat_t) (bool, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("is %s a bound loop device: %w", dev, err)
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if errors.Is(err, unix.ENXIO) {
		return false, nil // unbound
	}
	if err != nil {
		return false, fmt.Errorf("is %s a bound loop device: %w", dev, err)
	}
	if info.Flags&unix.LO_FLAGS_AUTOCLEAR != 0 {
		return false, nil // detached, or going as soon as it is closed
	}
	return info.Device == file.Dev && info.Inode == file.Ino, nil
}

// FindLoops returns the loop devices bound to file (as LoopBacks tells),
// none when none is.
func FindLoops(file string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return nil, fmt.Errorf("find the loop devices of %s: %w", file, err)
	}
	// Bound devices have a loop/backing_file in sysfs; the inode decides.
	bound, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, fmt.Errorf("find the loop devices of %s: %w", file, err)
	}
	var devs []string
	for _, attr := range bound {
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(attr)))
		ok, err := backs(dev, &st)
		if err != nil {
			return nil, fmt.Errorf("find the loop devices of %s: %w", file, err)
		}
		if ok {
			devs = append(devs, dev)
		}
	}
	return devs, nil
}

// Size is the size in bytes of a block device, or of any other file.
func Size(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd) // a block device's end is its size
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return size, nil
}
