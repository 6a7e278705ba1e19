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

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An image is written again only when something it is made of changed.
func TestBuildSkipsUnchangedInputs(t *testing.T) {
	dir := t.TempDir()
	src, out, archive := filepath.Join(dir, "hello"), filepath.Join(dir, "image"), filepath.Join(dir, "image.tar")
	write := func(content string) {
		if err := os.WriteFile(src, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--out", out, "--archive", archive, "--ref", "example.com/hello:dev", "--file", src + ":/hello:0755"}
	// written builds the image and reports whether its layout was written.
	written := func() bool {
		t.Helper()
		before, _ := os.Stat(filepath.Join(out, "index.json"))
		time.Sleep(10 * time.Millisecond)
		if err := build(context.Background(), args); err != nil {
			t.Fatal(err)
		}
		after, err := os.Stat(filepath.Join(out, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		return before == nil || !after.ModTime().Equal(before.ModTime())
	}

	write("one")
	if !written() {
		t.Fatal("the first build wrote nothing")
	}
	if written() {
		t.Error("the same inputs built again")
	}
	write("two")
	if !written() {
		t.Error("a changed file did not build again")
	}
	if err := os.Remove(archive); err != nil {
		t.Fatal(err)
	}
	if !written() {
		t.Error("a missing archive did not build again")
	}
	args = append(args, "--env", "A=b")
	if !written() {
		t.Error("other arguments did not build again")
	}
}
