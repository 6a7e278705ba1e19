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

// Package hotplug stands up one Kubernetes node's worth of containerDisk
// hotplug on the test host, for the functional suite and the benchmark: a
// kubelet pods directory, attachment pod containers that run the real
// container-disk program on an image root filesystem, virt-handler's
// hotplug volume mounter and virt-launcher's converter from the patched
// KubeVirt tree (the cdhotplug tool in testdata), and a domain of the
// framework's private libvirtd to attach the disks to.
package hotplug

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// Tools are the binaries built inside the patched tree.
type Tools struct {
	// CDHotplug drives virt-handler's mounter and virt-launcher's converter.
	CDHotplug string
	// VirtChroot is KubeVirt's own virt-chroot, which the mounter runs to
	// mount in the node's mount namespace.
	VirtChroot string
	// CDValidate runs virt-api's validation of a VMI spec.
	CDValidate string
}

// BuildTools builds cdhotplug, cdvalidate and virt-chroot inside the
// patched KubeVirt tree into dir. cdhotplug and virt-chroot run in a chroot
// with nothing else in it, so they are linked statically (no cgo).
func BuildTools(ctx context.Context, dir string) (Tools, error) {
	tree := testenv.KubeVirtTree()
	if old, set := os.LookupEnv("CGO_ENABLED"); set {
		defer os.Setenv("CGO_ENABLED", old)
	} else {
		defer os.Unsetenv("CGO_ENABLED")
	}
	os.Setenv("CGO_ENABLED", "0")
	err := testenv.BuildInKubeVirtTree(ctx, map[string]string{
		"cmd/cdhotplug":  filepath.Join(testenv.RepoRoot(), "tests", "hotplug", "testdata", "cdhotplug", "main.go"),
		"cmd/cdvalidate": filepath.Join(testenv.RepoRoot(), "tests", "hotplug", "testdata", "cdvalidate", "main.go"),
		// The tree's own main.go: the overlay replaces it with itself.
		"cmd/virt-chroot": filepath.Join(tree, "cmd", "virt-chroot", "main.go"),
	}, dir)
	if err != nil {
		return Tools{}, err
	}
	return Tools{
		CDHotplug:  filepath.Join(dir, "cdhotplug"),
		VirtChroot: filepath.Join(dir, "virt-chroot"),
		CDValidate: filepath.Join(dir, "cdvalidate"),
	}, nil
}

// TreeHasHotplug tells whether the KubeVirt tree has the containerDisk
// hotplug patches.
func TreeHasHotplug() error {
	_, err := os.Stat(filepath.Join(testenv.KubeVirtTree(), "pkg", "virt-handler", "hotplug-disk", "containerdisk.go"))
	return err
}

// Node is the test host seen as a Kubernetes node running one VMI.
type Node struct {
	tools Tools
	// ContainerDisk is the container-disk program the attachment pods'
	// init container copies into their binary emptyDir.
	containerDisk string
	// root holds what is not shared with QEMU: image layers, container
	// root filesystems, virt-handler's container.
	root string
	// KubeletPods is the kubelet pods directory, beneath the libvirtd's
	// shared directory so that QEMU sees what virt-handler mounts there.
	KubeletPods string
	// StateDir is virt-handler's hotplug mount record directory on the host.
	StateDir string
	// init is PID 1 of the node's PID namespace (see NewNode).
	init *exec.Cmd
}

// Identities of the VMI and its virt-launcher pod. Paths built from them
// end up in domain XML, which virt-launcher lowercases unless the disk has
// a backingStore.
const (
	VMIUID      = "vmi-0001"
	LauncherUID = "launcher-0001"
	handlerRoot = "virt-handler"
	stateInRoot = "/var/lib/hotplug-mount-state"
)

// NewNode lays out the kubelet pods directory under sharedDir (the private
// libvirtd's SharedDir), with the virt-launcher pod's hotplug-disks
// emptyDir, and virt-handler's container under root.
//
// virt-handler takes PID 1 for the node: its root, mount namespace and
// mounts. A test host's own PID 1 may be out of reach (a sandbox's init
// refuses /proc/1/root), so the node is a PID namespace whose init stays in
// the host's mount namespace; virt-handler and the attachment pod
// containers run in it, as they share the node's PID namespace on a real
// node (hostPID, and socket peer PIDs are only seen within one). Call Close
// when done.
func NewNode(tools Tools, containerDisk, root, sharedDir string) (*Node, error) {
	n := &Node{
		tools:         tools,
		containerDisk: containerDisk,
		root:          root,
		KubeletPods:   filepath.Join(sharedDir, "kubelet", "pods"),
		StateDir:      filepath.Join(root, handlerRoot, stateInRoot),
	}
	if _, err := os.Stat(containerDisk); err != nil {
		return nil, fmt.Errorf("the container-disk program (make): %w", err)
	}
	dirs := []string{n.StateDir, n.LauncherHotplugDir(), n.LauncherEphemeralDir()}
	for _, d := range []string{"pods", "proc", "dev", "usr/bin"} {
		dirs = append(dirs, filepath.Join(root, handlerRoot, d))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// virt-handler's image has the qemu user it gives device nodes to.
	if err := os.MkdirAll(filepath.Join(root, handlerRoot, "etc"), 0o755); err != nil {
		return nil, err
	}
	for f, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/:/bin/sh\nqemu:x:107:107:qemu:/:/sbin/nologin\n",
		"etc/group":  "root:x:0:\nqemu:x:107:\n",
	} {
		if err := os.WriteFile(filepath.Join(root, handlerRoot, f), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	// Mount points of the binaries in virt-handler's container.
	for _, f := range []string{"usr/bin/cdhotplug", "usr/bin/virt-chroot"} {
		if err := os.WriteFile(filepath.Join(root, handlerRoot, f), nil, 0o755); err != nil {
			return nil, err
		}
	}
	n.init = exec.Command("unshare", "--pid", "--fork", "--kill-child", "--", "sleep", "infinity")
	if err := n.init.Start(); err != nil {
		return nil, fmt.Errorf("start the node's PID namespace: %w", err)
	}
	// Until its init exists, a process entering the namespace would be
	// its PID 1.
	children := fmt.Sprintf("/proc/%d/task/%d/children", n.init.Process.Pid, n.init.Process.Pid)
	for deadline := time.Now().Add(socketTimeout); ; time.Sleep(10 * time.Millisecond) {
		if data, err := os.ReadFile(children); err == nil && len(bytes.TrimSpace(data)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(errors.New("the node's PID namespace has no init"), n.Close())
		}
	}
	return n, nil
}

// Close ends the node's PID namespace: its init and whatever still runs in
// it.
func (n *Node) Close() error {
	if err := n.init.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	_ = n.init.Wait() // killed
	return nil
}

// nodeCommand runs a command in the node's PID namespace.
func (n *Node) nodeCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	pidNS := fmt.Sprintf("--pid=/proc/%d/ns/pid_for_children", n.init.Process.Pid)
	return exec.CommandContext(ctx, "nsenter", append([]string{pidNS, "--", name}, args...)...)
}

// LauncherHotplugDir is the virt-launcher pod's hotplug-disks emptyDir on
// the host: /var/run/kubevirt/hotplug-disks in the pod.
func (n *Node) LauncherHotplugDir() string {
	return n.emptyDir(LauncherUID, "hotplug-disks")
}

// LauncherEphemeralDir is the virt-launcher pod's ephemeral-disks emptyDir
// on the host: /var/run/kubevirt-ephemeral-disks in the pod, where the
// overlay of a writable hotplugged containerDisk lives.
func (n *Node) LauncherEphemeralDir() string {
	return n.emptyDir(LauncherUID, "ephemeral-disks")
}

func (n *Node) emptyDir(podUID, volume string) string {
	return filepath.Join(n.KubeletPods, podUID, "volumes", "kubernetes.io~empty-dir", volume)
}

// ImageKind is what an image layer holds under /disk.
type ImageKind int

const (
	// RawFile is disk/disk.img, a raw image.
	RawFile ImageKind = iota
	// QCOW2File is disk/disk.img in qcow2.
	QCOW2File
	// BlockDevice is disk/disk.img, a device node of a loop device over a
	// raw image: what virt-handler must refuse to take from an image.
	BlockDevice
	// NoImage is an empty /disk.
	NoImage
)

// Pattern is the content of every image: region i of RegionSize bytes is
// filled with byte PatternByte(i).
const (
	RegionSize = 1 << 20
	Regions    = 4
)

// PatternByte is the byte region i of an image is filled with.
func PatternByte(i int) byte { return byte(0x41 + i) }

// ImageLayer is the unpacked layer of a containerDisk image: the lower
// directory of its containers' root filesystems.
type ImageLayer struct {
	Dir string
	// Image is disk/disk.img in the layer; Content a raw image of what a
	// reader of the disk must see.
	Image, Content string
	// Device is the loop device of a BlockDevice layer, to detach.
	Device string
}

// NewImageLayer writes an image layer of kind under dir.
func NewImageLayer(ctx context.Context, dir string, kind ImageKind) (*ImageLayer, error) {
	l := &ImageLayer{Dir: filepath.Join(dir, "layer")}
	if err := os.MkdirAll(filepath.Join(l.Dir, "disk"), 0o755); err != nil {
		return nil, err
	}
	if kind == NoImage {
		return l, nil
	}
	raw := filepath.Join(dir, "pattern.raw")
	l.Content = raw
	var data []byte
	for i := 0; i < Regions; i++ {
		data = append(data, bytes.Repeat([]byte{PatternByte(i)}, RegionSize)...)
	}
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		return nil, err
	}
	l.Image = filepath.Join(l.Dir, "disk", "disk.img")
	switch kind {
	case RawFile:
		return l, copyFile(raw, l.Image)
	case QCOW2File:
		_, err := testenv.QemuImg(ctx, "convert", "-f", "raw", "-O", "qcow2", raw, l.Image)
		return l, err
	case BlockDevice:
		dev, err := testenv.AttachLoop(ctx, raw)
		if err != nil {
			return nil, err
		}
		l.Device = dev
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			return l, fmt.Errorf("stat %s: %w", dev, err)
		}
		if err := unix.Mknod(l.Image, unix.S_IFBLK|0o660, int(st.Rdev)); err != nil {
			return l, fmt.Errorf("mknod %s: %w", l.Image, err)
		}
		return l, nil
	}
	return nil, fmt.Errorf("unknown image kind %d", kind)
}

// Close detaches a block device image's loop device.
func (l *ImageLayer) Close(ctx context.Context) error {
	if l.Device == "" {
		return nil
	}
	if err := os.Remove(l.Image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return testenv.DetachLoop(ctx, l.Device)
}

// Volume is a hotplugged containerDisk of the VMI.
type Volume struct {
	Name string
	// AttachPodUID is the attachment pod serving it; empty before it runs.
	AttachPodUID string
	// Path is containerDisk.path, empty for the single file under /disk.
	Path string
	// Writable asks for a writable disk: an ephemeral overlay over the
	// image.
	Writable bool
}

// VMI renders the VMI with the volumes hotplugged on scsi, each in phase,
// as JSON for cdhotplug.
func VMI(phase string, volumes ...Volume) []byte {
	type obj = map[string]any
	var disks, vols, statuses []obj
	for _, v := range volumes {
		disks = append(disks, obj{"name": v.Name, "disk": obj{"bus": "scsi", "readonly": !v.Writable}})
		source := obj{"image": "registry.example/tools-disk:1.2", "hotpluggable": true}
		if v.Path != "" {
			source["path"] = v.Path
		}
		vols = append(vols, obj{"name": v.Name, "containerDisk": source})
		statuses = append(statuses, obj{
			"name":          v.Name,
			"target":        "",
			"phase":         phase,
			"hotplugVolume": obj{"attachPodName": "hp-volume-" + v.AttachPodUID, "attachPodUID": v.AttachPodUID},
		})
	}
	data, err := json.Marshal(obj{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachineInstance",
		"metadata":   obj{"name": "vm1", "namespace": "default", "uid": VMIUID},
		"spec": obj{
			"domain":  obj{"devices": obj{"disks": disks}},
			"volumes": vols,
		},
		"status": obj{
			"activePods":   obj{LauncherUID: "node"},
			"volumeStatus": statuses,
		},
	})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return data
}

// Report is what cdhotplug prints after a virt-handler step.
type Report struct {
	VolumeStatus []struct {
		Name                string `json:"name"`
		ContainerDiskVolume *struct {
			Checksum uint32 `json:"checksum"`
		} `json:"containerDiskVolume"`
	} `json:"volumeStatus"`
	Mounted     map[string]bool `json:"mounted"`
	DeviceRules []struct {
		Major int64 `json:"major"`
		Minor int64 `json:"minor"`
		Allow bool  `json:"allow"`
	} `json:"deviceRules"`
	DiscoveryNanos map[string]int64 `json:"discoveryNanos"`
	StepNanos      int64            `json:"stepNanos"`
}

// handlerScript runs cdhotplug in virt-handler's container: a mount
// namespace chrooted into a root with /proc of the host PID namespace (PID 1
// is the node's init), the tools at their image paths, and the kubelet pods
// directory twice, as virt-handler's DaemonSet mounts it: at /pods, and at
// its own path, where the mounter resolves /proc/1/root/<pods directory>
// (safepath resolves the /proc/1/root link within the container's root).
// The namespace is a slave of the node's, so the mounts virt-chroot makes
// in the node's namespace reach it, as with the DaemonSet's Bidirectional
// propagation.
const handlerScript = `set -e
root=$1 pods=$2 tool=$3 chroot_bin=$4
shift 4
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --rbind "$pods" "$root/pods"
mkdir -p "$root$pods"
mount --rbind "$pods" "$root$pods"
mount --bind "$tool" "$root/usr/bin/cdhotplug"
mount --bind "$chroot_bin" "$root/usr/bin/virt-chroot"
exec chroot "$root" /usr/bin/cdhotplug "$@"`

// Mount runs virt-handler's hotplug volume mounter on the VMI.
func (n *Node) Mount(ctx context.Context, vmi []byte) (Report, error) {
	return n.handler(ctx, vmi, "mount")
}

// Unmount runs the mounter's unmount of volumes no longer in the VMI's
// spec; with all, of everything it recorded (VMI teardown).
func (n *Node) Unmount(ctx context.Context, vmi []byte, all bool) (Report, error) {
	if all {
		return n.handler(ctx, vmi, "unmount", "-all")
	}
	return n.handler(ctx, vmi, "unmount")
}

func (n *Node) handler(ctx context.Context, vmi []byte, step string, args ...string) (Report, error) {
	root := filepath.Join(n.root, handlerRoot)
	cmdArgs := append([]string{"--mount", "--propagation", "slave", "--", "sh", "-c", handlerScript, "sh",
		root, n.KubeletPods, n.tools.CDHotplug, n.tools.VirtChroot,
		step, "-kubelet-pods", n.KubeletPods, "-state", stateInRoot}, args...)
	out, err := run(n.nodeCommand(ctx, "unshare", cmdArgs...), vmi)
	if err != nil {
		return Report{}, err
	}
	var r Report
	if err := json.Unmarshal(out, &r); err != nil {
		return Report{}, fmt.Errorf("cdhotplug %s printed %q: %w", step, out, err)
	}
	return r, nil
}

// Disks runs virt-launcher's probing, overlay creation and conversion of
// the VMI and returns the XML of each hotplug disk as the launcher attaches
// it.
func (n *Node) Disks(ctx context.Context, vmi []byte) ([]string, error) {
	out, err := run(exec.CommandContext(ctx, n.tools.CDHotplug, "disks",
		"-hotplug-dir", n.LauncherHotplugDir(), "-ephemeral-dir", n.LauncherEphemeralDir()), vmi)
	if err != nil {
		return nil, err
	}
	var disks []string
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" {
			disks = append(disks, line)
		}
	}
	return disks, nil
}

// UnplugOverlays runs the launcher's removal of the overlays of writable
// volumes no longer in the VMI.
func (n *Node) UnplugOverlays(ctx context.Context, vmi []byte) error {
	_, err := run(exec.CommandContext(ctx, n.tools.CDHotplug, "unplug", "-ephemeral-dir", n.LauncherEphemeralDir()), vmi)
	return err
}

// Cause is a cause of a refusal by virt-api's validation.
type Cause struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Validate runs virt-api's validation of each VMI's spec and returns the
// causes of each refusal.
func (n *Node) Validate(ctx context.Context, vmis ...[]byte) ([][]Cause, error) {
	out, err := run(exec.CommandContext(ctx, n.tools.CDValidate), bytes.Join(vmis, nil))
	if err != nil {
		return nil, err
	}
	var causes [][]Cause
	dec := json.NewDecoder(bytes.NewReader(out))
	for range vmis {
		var c []Cause
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("cdvalidate printed %q: %w", out, err)
		}
		causes = append(causes, c)
	}
	return causes, nil
}

// Processes lists the processes in the node's PID namespace other than
// its init, by their PIDs on the host.
func (n *Node) Processes() ([]int, error) {
	nodeNS, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid_for_children", n.init.Process.Pid))
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && ns == nodeNS && !n.isInit(pid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func (n *Node) isInit(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", n.init.Process.Pid, n.init.Process.Pid))
	return err == nil && strings.TrimSpace(string(data)) == strconv.Itoa(pid)
}

// run runs cmd with input on its standard input; an error carries what it
// printed on standard error.
func run(cmd *exec.Cmd, input []byte) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdin = bytes.NewReader(input)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &StepError{Err: err, Stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// StepError is a failed cdhotplug step with what it said.
type StepError struct {
	Err    error
	Stderr string
}

func (e *StepError) Error() string { return fmt.Sprintf("%v: %s", e.Err, e.Stderr) }

func (e *StepError) Unwrap() error { return e.Err }
