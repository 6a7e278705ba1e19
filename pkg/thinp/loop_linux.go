package thinp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
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
	name := filepath.Base(device)
	data, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return nil, fmt.Errorf("find the backing file of %s: %w", device, err)
	}
	return &LoopExtender{Device: device, BackingFile: strings.TrimSpace(string(data))}, nil
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
	dev, err := os.Open(l.Device)
	if err != nil {
		return 0, fmt.Errorf("extend %s: %w", l.Device, err)
	}
	defer dev.Close()
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return 0, fmt.Errorf("extend %s: LOOP_SET_CAPACITY: %w", l.Device, err)
	}
	got, err := unix.IoctlGetUint64(int(dev.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return 0, fmt.Errorf("extend %s: read device size: %w", l.Device, err)
	}
	return int64(got), nil
}
