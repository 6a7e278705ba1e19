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

package ociimage

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// WithLibraries is the dynamically linked binary at source as an image file
// at imagePath, plus the shared libraries and the program interpreter it
// loads on this machine, each at the path where the loader finds it here.
// The binary then runs in an image from scratch. A static binary comes
// alone. ctx bounds the ldd that lists the libraries.
func WithLibraries(ctx context.Context, source, imagePath string, mode os.FileMode) ([]File, error) {
	files := []File{{Source: source, Path: imagePath, Mode: mode}}
	interp, err := Interpreter(source)
	if err != nil {
		return nil, err
	}
	if interp == "" {
		return files, nil
	}
	files = append(files, File{Source: interp, Path: interp, Mode: 0o755})
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ldd", source)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("libraries of %s: ldd: %w: %s", source, err, strings.TrimSpace(stderr.String()))
	}
	for _, line := range strings.Split(string(out), "\n") {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)"; the
		// vDSO and the interpreter have no "=>" path.
		_, target, ok := strings.Cut(line, "=>")
		if !ok {
			continue
		}
		fields := strings.Fields(target)
		if len(fields) == 0 || !filepath.IsAbs(fields[0]) {
			return nil, fmt.Errorf("libraries of %s: unresolved: %s", source, strings.TrimSpace(line))
		}
		lib := filepath.Clean(fields[0])
		if lib != interp {
			files = append(files, File{Source: lib, Path: lib, Mode: 0o644})
		}
	}
	return files, nil
}

// Interpreter is the program interpreter an ELF binary names (PT_INTERP),
// empty for a static binary.
func Interpreter(binary string) (string, error) {
	f, err := elf.Open(binary)
	if err != nil {
		return "", fmt.Errorf("read ELF %s: %w", binary, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		buf := make([]byte, p.Filesz)
		if _, err := p.ReadAt(buf, 0); err != nil {
			return "", fmt.Errorf("read ELF %s: interpreter: %w", binary, err)
		}
		return string(bytes.TrimRight(buf, "\x00")), nil
	}
	return "", nil
}
