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

// Package testenv holds what the functional suites under tests/ share:
// where the repository and its build outputs are, a private libvirtd, a
// bootable test guest, disk images, loop devices and a Kubernetes API server.
package testenv

import (
	"path/filepath"
	"runtime"
)

// RepoRoot is the top of the kubevirt-qcow2 checkout the tests run from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// OutDir is where `make` puts build outputs (_out/).
func OutDir() string {
	return filepath.Join(RepoRoot(), "_out")
}

// Binary is the path of a binary `make` built into _out/bin.
func Binary(name string) string {
	return filepath.Join(OutDir(), "bin", name)
}
