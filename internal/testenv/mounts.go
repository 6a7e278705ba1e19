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
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo file (proc(5)).
type Mount struct {
	ID       int
	ParentID int
	// Root is the directory of the filesystem mounted here: for a bind
	// mount of a file or subdirectory, its path within its filesystem.
	Root       string
	MountPoint string
	Options    string
	// Optional holds the propagation tags, e.g. "shared:12", "master:3".
	Optional []string
	FSType   string
	Source   string
}

// MountPoints lists the mounts the test process sees (/proc/self/mountinfo).
func MountPoints() ([]Mount, error) {
	return ReadMountInfo("/proc/self/mountinfo")
}

// ReadMountInfo parses a mountinfo file such as /proc/PID/mountinfo.
func ReadMountInfo(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var mounts []Mount
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		m, err := parseMountInfoLine(scanner.Text())
		if err != nil {
			return nil, fmt.Errorf("read mounts from %s: %w", path, err)
		}
		mounts = append(mounts, m)
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("read mounts from %s: %w", path, err)
	}
	return mounts, nil
}

// A line: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
func parseMountInfoLine(line string) (Mount, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || len(fields) < sep+3 {
		return Mount{}, fmt.Errorf("malformed mountinfo line %q", line)
	}
	id, err := strconv.Atoi(fields[0])
	if err != nil {
		return Mount{}, fmt.Errorf("malformed mountinfo line %q: %w", line, err)
	}
	parent, err := strconv.Atoi(fields[1])
	if err != nil {
		return Mount{}, fmt.Errorf("malformed mountinfo line %q: %w", line, err)
	}
	return Mount{
		ID:         id,
		ParentID:   parent,
		Root:       unescapeMountInfo(fields[3]),
		MountPoint: unescapeMountInfo(fields[4]),
		Options:    fields[5],
		Optional:   fields[6:sep],
		FSType:     fields[sep+1],
		Source:     unescapeMountInfo(fields[sep+2]),
	}, nil
}

// unescapeMountInfo undoes the kernel's octal escapes (\040 for a blank).
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
