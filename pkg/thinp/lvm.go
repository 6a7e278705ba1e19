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
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// LVMExtender grows an LVM logical volume with lvextend and refreshes its
// device-mapper table on this host with `lvchange --refresh`, which a host
// needs when the volume group is shared and another host ran the lvextend.
type LVMExtender struct {
	// VolumeGroup and LogicalVolume name the volume.
	VolumeGroup   string
	LogicalVolume string
	// Exec runs an LVM command and returns its standard output; nil runs
	// the command found on PATH. Tests replace it.
	Exec func(ctx context.Context, name string, args ...string) ([]byte, error)
}

func (l *LVMExtender) name() string {
	return l.VolumeGroup + "/" + l.LogicalVolume
}

func (l *LVMExtender) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if l.Exec != nil {
		return l.Exec(ctx, name, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return stdout.Bytes(), nil
}

// size reads the volume's size in bytes.
func (l *LVMExtender) size(ctx context.Context) (int64, error) {
	out, err := l.run(ctx, "lvs", "--noheadings", "--nosuffix", "--units", "b", "-o", "lv_size", l.name())
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse lvs size %q: %w", strings.TrimSpace(string(out)), err)
	}
	return n, nil
}

// Extend grows the volume to at least size bytes (LVM rounds up to whole
// extents) and refreshes it.
func (l *LVMExtender) Extend(ctx context.Context, size int64) (int64, error) {
	current, err := l.size(ctx)
	if err != nil {
		return 0, fmt.Errorf("extend logical volume %s: %w", l.name(), err)
	}
	if current < size {
		// --autobackup n: metadata backups are the volume group owner's
		// business and cost a file write per chunk.
		if _, err := l.run(ctx, "lvextend", "--autobackup", "n", "--size", strconv.FormatInt(size, 10)+"b", l.name()); err != nil {
			return 0, fmt.Errorf("extend logical volume %s to %d bytes: %w", l.name(), size, err)
		}
	}
	if _, err := l.run(ctx, "lvchange", "--refresh", l.name()); err != nil {
		return 0, fmt.Errorf("refresh logical volume %s: %w", l.name(), err)
	}
	got, err := l.size(ctx)
	if err != nil {
		return 0, fmt.Errorf("extend logical volume %s: %w", l.name(), err)
	}
	return got, nil
}
