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
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var shellBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// DocShellBlocks returns the shell blocks (```sh) of the section of a
// Markdown file (relative to the tree's root) whose heading line is heading ("## Install"),
// in order: the commands a user types, for tests to run as written. The
// section ends at the next heading of its level or above.
func DocShellBlocks(file, heading string) ([]string, error) {
	path := file
	if !filepath.IsAbs(path) {
		path = filepath.Join(RepoRoot(), file)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	level := leadingHashes(heading)
	var section []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if in && strings.HasPrefix(line, "#") {
			if hashes := leadingHashes(line); len(hashes) <= len(level) && strings.HasPrefix(line, hashes+" ") {
				break
			}
		}
		if line == heading {
			in = true
			continue
		}
		if in {
			section = append(section, line)
		}
	}
	if !in {
		return nil, fmt.Errorf("%s has no section %q", file, heading)
	}
	var blocks []string
	for _, m := range shellBlock.FindAllStringSubmatch(strings.Join(section, "\n"), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks, nil
}

// DocCommand returns the words of the one command line of a section's
// shell blocks that has the words of want in a row, its comment dropped:
// "-k deploy/kubevirt" is not found in "-k deploy/kubevirt-hook".
func DocCommand(file, heading, want string) ([]string, error) {
	blocks, err := DocShellBlocks(file, heading)
	if err != nil {
		return nil, err
	}
	// Words between single spaces, so that a match starts and ends on a word.
	words := func(s string) string { return " " + strings.Join(strings.Fields(s), " ") + " " }
	wanted := words(want)
	var found []string
	for _, block := range blocks {
		for _, line := range strings.Split(block, "\n") {
			line, _, _ = strings.Cut(line, " #")
			if strings.Contains(words(line), wanted) {
				found = append(found, line)
			}
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%s, %q: %d command lines with %q, want one", file, heading, len(found), want)
	}
	return strings.Fields(found[0]), nil
}

func leadingHashes(line string) string {
	return line[:len(line)-len(strings.TrimLeft(line, "#"))]
}
