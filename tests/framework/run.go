package framework

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// run executes a command and returns its standard output; a failure carries
// the command line and what it printed on standard error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	return runCmd(exec.CommandContext(ctx, name, args...))
}

func runCmd(cmd *exec.Cmd) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// BuildCommand builds the command in the repository's package pkg (e.g.
// "./cmd/qcow2-backup") into dir and returns the binary's path.
func BuildCommand(ctx context.Context, pkg, dir string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = RepoRoot()
	if _, err := runCmd(cmd); err != nil {
		return "", err
	}
	return bin, nil
}
