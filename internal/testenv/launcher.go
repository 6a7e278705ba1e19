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
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// Paths of the virt-launcher compute container, as the patched tree's
// pkg/storage/overlay names them for an overlay volume.
const (
	LauncherPrivateDir   = "/var/run/kubevirt-private"
	LauncherEphemeralDir = "/var/run/kubevirt-ephemeral-disks"
)

// OverlayBackingImage is where the compute container finds the backing of
// a file-backed overlay volume (Filesystem mode claim or host path).
func OverlayBackingImage(volume string) string {
	return LauncherPrivateDir + "/overlay-backing/" + volume + "/disk.img"
}

// OverlayTargetDir is where the compute container finds the target
// directory of a persistent overlay volume (Filesystem mode claim or host
// path); the overlay is disk.qcow2 in it.
func OverlayTargetDir(volume string) string {
	return LauncherPrivateDir + "/overlay-target/" + volume
}

// OverlayEphemeralImage is the overlay of an ephemeral overlay volume.
func OverlayEphemeralImage(volume string) string {
	return LauncherEphemeralDir + "/overlay-data/" + volume + "/disk.qcow2"
}

// OverlayBackingDevice is the device of a Block mode backing claim.
func OverlayBackingDevice(volume string) string { return "/dev/overlay-backing-" + volume }

// OverlayTargetDevice is the device of a Block mode target claim.
func OverlayTargetDevice(volume string) string { return "/dev/overlay-target-" + volume }

// VMI2Domain is the vmi2domain tool (testdata/vmi2domain), built inside
// the patched KubeVirt tree: the patched virt-launcher's converter and
// overlay steps, run on this host.
type VMI2Domain string

// BuildVMI2Domain builds vmi2domain into outDir.
func BuildVMI2Domain(ctx context.Context, outDir string) (VMI2Domain, error) {
	source := filepath.Join(RepoRoot(), "internal", "testenv", "testdata", "vmi2domain", "main.go")
	if err := BuildInKubeVirtTree(ctx, map[string]string{"cmd/vmi2domain": source}, outDir); err != nil {
		return "", err
	}
	return VMI2Domain(filepath.Join(outDir, "vmi2domain")), nil
}

// Launcher runs virt-launcher's steps for one VMI on this host: the paths
// of the compute container are found on the host through Maps (container
// path prefix to host path; the longest prefix wins, as in the tool).
type Launcher struct {
	Tool VMI2Domain
	// VMI is the VMI manifest file.
	VMI  string
	Maps map[string]string
	// BackingClaims stands in for virt-controller: the UID of the claim
	// backing each overlay volume, by volume name. The claim is bound to
	// the volume "pv-<UID>".
	BackingClaims map[string]string
}

// backingClaimsEnv is the patched virt-launcher's variable for what
// virt-controller says of the backing claims (pkg/storage/overlay).
const backingClaimsEnv = "KUBEVIRT_OVERLAY_BACKING_CLAIMS"

// Run runs the tool with extra arguments (-prepare, -cleanup, ...) and
// returns its standard output and error.
func (l Launcher) Run(ctx context.Context, args ...string) (string, string, error) {
	all := []string{"-vmi", l.VMI}
	for old, repl := range l.Maps {
		all = append(all, "-map", old+"="+repl)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, string(l.Tool), append(all, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if len(l.BackingClaims) > 0 {
		claims := map[string]map[string]string{}
		for volume, uid := range l.BackingClaims {
			claims[volume] = map[string]string{"uid": uid, "volumeName": "pv-" + uid}
		}
		value, err := json.Marshal(claims)
		if err != nil {
			return "", "", err
		}
		cmd.Env = append(os.Environ(), backingClaimsEnv+"="+string(value))
	}
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("vmi2domain %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), stderr.String(), err
}

// Prepare runs the pre-start step (create or validate the overlays) and
// returns the domain the converter made of the VMI.
func (l Launcher) Prepare(ctx context.Context) (*libvirtxml.Domain, error) {
	out, _, err := l.Run(ctx, "-prepare")
	if err != nil {
		return nil, err
	}
	dom := &libvirtxml.Domain{}
	if err := dom.Unmarshal(out); err != nil {
		return nil, fmt.Errorf("domain of %s: %w", l.VMI, err)
	}
	return dom, nil
}

// Cleanup runs the teardown step: it removes the ephemeral overlays.
func (l Launcher) Cleanup(ctx context.Context) error {
	_, _, err := l.Run(ctx, "-cleanup")
	return err
}

// Host is where this host has a path of the compute container.
func (l Launcher) Host(path string) string {
	best := ""
	for old := range l.Maps {
		if (path == old || strings.HasPrefix(path, old+"/")) && len(old) > len(best) {
			best = old
		}
	}
	if best == "" {
		return path
	}
	return l.Maps[best] + strings.TrimPrefix(path, best)
}

// OverlayVMI is the manifest of a VMI with one virtio disk, from the
// overlay volume named volume; overlay holds the overlay source's fields,
// one "key: value" each.
func OverlayVMI(name, namespace, volume string, overlay ...string) string {
	return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: %s
  namespace: %s
spec:
  domain:
    devices:
      disks:
      - name: %s
        disk: {bus: virtio}
  volumes:
  - name: %s
    overlay:
      %s
`, name, namespace, volume, volume, strings.Join(overlay, "\n      "))
}
