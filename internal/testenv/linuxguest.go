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
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// LinuxGuestImage builds the Linux test guest once (hack/guest-image.sh,
// cached by its packages' versions) and returns the raw image's path. The
// image is shared: copy it, or put an overlay over it, before booting it.
func LinuxGuestImage(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(RepoRoot(), "hack", "guest-image.sh")).Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return "", fmt.Errorf("hack/guest-image.sh: %w: %s", err, exitErr.Stderr)
		}
		return "", fmt.Errorf("hack/guest-image.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// LinuxGuestStatus is what the Linux test guest (hack/guest/guest-test)
// reported on its serial console during its last boot.
type LinuxGuestStatus struct {
	// Boot counts the boots of the disk, this one included.
	Boot int
	// Golden tells whether the content the image was built with checked
	// ("OK") or not ("BAD"); empty before the guest got there.
	Golden string
	// Verified of Listed pieces published by earlier boots read back.
	Verified, Listed int
	// Bad are the published pieces that did not read back.
	Bad []int
	// Published are the pieces this boot wrote and made durable, by number,
	// with their SHA-256.
	Published map[int]string
	// Trimmed is what fstrim released, -1 when the guest did not trim.
	Trimmed int64
	// Full tells that the guest stopped writing for want of room; Done that
	// it has nothing more to do.
	Full, Done bool
	// Writes are the guest's writes to disks plugged in while it ran, in
	// order.
	Writes []DiskWrite
	// Reads are the guest's reads of what it wrote there, each when
	// another disk was plugged in, in order.
	Reads []DiskRead
	// Errors are what the guest could not do ("KQG ERROR ...").
	Errors []string
}

// DiskWrite is the Linux test guest's write at the start of a disk plugged
// in while it ran.
type DiskWrite struct {
	// Device is the guest's name of the disk ("sda").
	Device string
	// Bytes written and their SHA-256; Failed when the disk refused them.
	Bytes  int64
	SHA256 string
	Failed bool
}

// DiskRead is the Linux test guest's read, on a disk plugged in while it
// ran, of what it wrote there.
type DiskRead struct {
	// Device is the guest's name of the disk ("sda"); OK tells that it
	// read back what it wrote.
	Device string
	OK     bool
}

// Consistent tells whether the guest saw its golden content and every
// piece it had published before, and met no error.
func (s LinuxGuestStatus) Consistent() bool {
	return s.Golden == "OK" && len(s.Bad) == 0 && s.Verified == s.Listed && len(s.Errors) == 0
}

// ParseLinuxGuest reads the Linux test guest's lines ("KQG ...") from its
// serial console, keeping those of its last boot.
func ParseLinuxGuest(serial string) LinuxGuestStatus {
	status := LinuxGuestStatus{Published: map[int]string{}, Trimmed: -1}
	for _, line := range strings.Split(serial, "\n") {
		_, report, found := strings.Cut(strings.TrimSpace(line), "KQG ")
		if !found {
			continue
		}
		fields := strings.Fields(report)
		if len(fields) == 0 {
			continue
		}
		number := func(i int) int64 {
			if i >= len(fields) {
				return -1
			}
			n, err := strconv.ParseInt(fields[i], 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
		switch fields[0] {
		case "BOOT":
			status = LinuxGuestStatus{Boot: int(number(1)), Published: map[int]string{}, Trimmed: -1}
		case "GOLDEN":
			if len(fields) > 1 {
				status.Golden = fields[1]
			}
		case "VERIFIED":
			if len(fields) > 1 {
				good, listed, _ := strings.Cut(fields[1], "/")
				status.Verified, _ = strconv.Atoi(good)
				status.Listed, _ = strconv.Atoi(listed)
			}
		case "BAD":
			status.Bad = append(status.Bad, int(number(1)))
		case "PUBLISHED":
			if len(fields) > 2 {
				status.Published[int(number(1))] = fields[2]
			}
		case "TRIMMED":
			status.Trimmed = number(1)
		case "FULL":
			status.Full = true
		case "DONE":
			status.Done = true
		case "ERROR":
			status.Errors = append(status.Errors, strings.Join(fields[1:], " "))
		case "WROTE":
			switch {
			case len(fields) == 3 && fields[2] == "FAILED":
				status.Writes = append(status.Writes, DiskWrite{Device: fields[1], Failed: true})
			case len(fields) == 4:
				status.Writes = append(status.Writes, DiskWrite{Device: fields[1], Bytes: number(2), SHA256: fields[3]})
			}
		case "READ":
			if len(fields) == 3 {
				status.Reads = append(status.Reads, DiskRead{Device: fields[1], OK: fields[2] == "OK"})
			}
		}
	}
	return status
}
