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
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// blkZeroOut is the BLKZEROOUT ioctl, _IO(0x12, 127), which x/sys/unix
// does not name: it zeroes a byte range of a block device, through the
// device's own zeroing (an unmap that reads back as zeroes, a write-zeroes
// command) where it has one, or by writing zeroes.
const blkZeroOut = 0x127f

// zeroChunk is what Zero writes at once when the device cannot zero.
const zeroChunk = 1 << 20

// Zero makes length bytes of the block device f from offset read as
// zeroes, both multiples of 512. A device that refuses BLKZEROOUT gets
// zeroes written.
func Zero(f *os.File, offset, length int64) error {
	if length == 0 {
		return nil
	}
	r := [2]uint64{uint64(offset), uint64(length)}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), blkZeroOut, uintptr(unsafe.Pointer(&r[0])))
	if errno == 0 {
		return nil
	}
	if !errors.Is(errno, unix.ENOTTY) && !errors.Is(errno, unix.EOPNOTSUPP) && !errors.Is(errno, unix.EINVAL) {
		return fmt.Errorf("zero %d bytes of %s at %d: %w", length, f.Name(), offset, errno)
	}
	zeroes := make([]byte, min(length, zeroChunk))
	for done := int64(0); done < length; {
		n, err := f.WriteAt(zeroes[:min(length-done, zeroChunk)], offset+done)
		if err != nil {
			return fmt.Errorf("zero %d bytes of %s at %d: %w", length, f.Name(), offset, err)
		}
		done += int64(n)
	}
	return nil
}
