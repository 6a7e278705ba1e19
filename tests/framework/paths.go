// Package framework holds what the functional suites under tests/ share:
// where the repository and its build outputs are, a private libvirtd, a
// bootable test guest, disk images, loop devices and a Kubernetes API server.
package framework

import (
	"os"
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

// InCI reports whether the run is CI's, where nothing may be skipped.
func InCI() bool {
	return os.Getenv("CI") == "true"
}
