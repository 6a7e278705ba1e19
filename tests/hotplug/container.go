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

package hotplug

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"golang.org/x/sys/unix"
)

// Paths inside an attachment pod's containerDisk container, as the patched
// virt-controller renders it: the emptyDir named after the volume, the
// emptyDir the init container copies the program into, and the program's
// --copy-path there.
const (
	socketDirInPod = "/hotplug-container-disk"
	binaryDirInPod = "/container-disk-binary"
	binaryVolume   = "hotplug-container-disk-binary"
	copyPathInPod  = socketDirInPod + "/disk"
)

// containerScript runs the container-disk program as a container runtime
// would: in a mount namespace of its own, with the image's root filesystem
// as its root and the pod's emptyDirs mounted into it. exec keeps the PID,
// so the socket's peer is the program itself.
const containerScript = `set -e
rootfs=$1 sockets=$2 binaries=$3
mount --bind "$sockets" "$rootfs` + socketDirInPod + `"
mount -o bind,ro "$binaries" "$rootfs` + binaryDirInPod + `"
exec chroot "$rootfs" ` + binaryDirInPod + `/container-disk --copy-path ` + copyPathInPod

// Container is the container of an attachment pod that serves one
// hotplugged containerDisk.
type Container struct {
	// Socket is where the program listens, on the host.
	Socket string
	// RootFS is the container's root filesystem mount, an overlay of the
	// image layer.
	RootFS  string
	podDir  string
	dir     string
	cmd     *exec.Cmd
	pid     int
	exited  chan struct{}
	waitErr error
}

// socketTimeout bounds waiting for the program's socket, and for it to
// notice its socket is gone (it polls about once a second).
const socketTimeout = 10 * time.Second

// StartContainer runs the attachment pod podUID's container for volume:
// the pod's emptyDirs under the kubelet pods directory (the binary copied
// in, as by the init container), an overlay root filesystem over the
// image layer, and the program serving its socket.
func (n *Node) StartContainer(ctx context.Context, podUID, volume string, layer *ImageLayer) (*Container, error) {
	c := &Container{
		podDir: filepath.Join(n.KubeletPods, podUID),
		dir:    filepath.Join(n.root, "containers", podUID),
		exited: make(chan struct{}),
	}
	sockets := n.emptyDir(podUID, volume)
	binaries := n.emptyDir(podUID, binaryVolume)
	c.Socket = filepath.Join(sockets, filepath.Base(copyPathInPod)+".sock")
	c.RootFS = filepath.Join(c.dir, "rootfs")
	for _, d := range []string{sockets, binaries, c.RootFS, filepath.Join(c.dir, "upper"), filepath.Join(c.dir, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := copyFile(n.containerDisk, filepath.Join(binaries, "container-disk")); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", layer.Dir, filepath.Join(c.dir, "upper"), filepath.Join(c.dir, "work"))
	if err := unix.Mount("overlay", c.RootFS, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("mount the root filesystem of %s: %w", podUID, err)
	}
	// The runtime creates the mount points in the container's own layer.
	for _, d := range []string{socketDirInPod, binaryDirInPod} {
		if err := os.MkdirAll(filepath.Join(c.RootFS, d), 0o755); err != nil {
			return nil, errors.Join(err, c.cleanup())
		}
	}
	// nsenter waits for the program and exits as it does.
	c.cmd = n.nodeCommand(context.WithoutCancel(ctx), "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", containerScript, "sh", c.RootFS, sockets, binaries)
	c.cmd.Stdout, c.cmd.Stderr = os.Stderr, os.Stderr
	if err := c.cmd.Start(); err != nil {
		return nil, errors.Join(err, c.cleanup())
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	if err := c.waitFor(ctx, func() bool { return isSocket(c.Socket) }); err != nil {
		return nil, errors.Join(fmt.Errorf("container-disk of %s did not listen on %s: %w", podUID, c.Socket, err), c.Stop(ctx))
	}
	pid, err := peerPid(c.Socket)
	if err != nil {
		return nil, errors.Join(err, c.Stop(ctx))
	}
	c.pid = pid
	return c, nil
}

// Pid is the container-disk program's process, in the host's PID namespace.
func (c *Container) Pid() int { return c.pid }

// peerPid is the PID of the process listening on socket.
func peerPid(socket string) (int, error) {
	conn, err := testenv.DialUnix(socket)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	return testenv.PeerPID(conn)
}

// Running tells whether the program still runs.
func (c *Container) Running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// Stop ends the container as the kubelet does when the attachment pod
// goes (SIGTERM: the program removes its socket and exits 0), unmounts its
// root filesystem and removes the pod's directory.
func (c *Container) Stop(ctx context.Context) error {
	if c.Running() && c.pid != 0 {
		if err := unix.Kill(c.pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	var errs []error
	if err := c.Wait(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, c.cleanup())...)
}

// Kill ends the program with SIGKILL: its socket file stays behind, with
// nobody listening.
func (c *Container) Kill(ctx context.Context) error {
	if err := unix.Kill(c.pid, unix.SIGKILL); err != nil {
		return err
	}
	<-c.exited
	return nil
}

// Wait waits for the program to exit and reports an exit other than 0 or
// by SIGKILL.
func (c *Container) Wait(ctx context.Context) error {
	select {
	case <-c.exited:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(socketTimeout):
		return fmt.Errorf("container-disk %d did not exit", c.Pid())
	}
	// nsenter passes a SIGKILL of the program on as its own, or as 137.
	var exit *exec.ExitError
	if errors.As(c.waitErr, &exit) {
		if status := exit.Sys().(syscall.WaitStatus); status.Signal() == syscall.SIGKILL || status.ExitStatus() == 128+int(syscall.SIGKILL) {
			return nil
		}
	}
	return c.waitErr
}

func (c *Container) cleanup() error {
	if err := unix.Unmount(c.RootFS, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		// Removing the directories would reach into the image.
		return fmt.Errorf("unmount %s: %w", c.RootFS, err)
	}
	var errs []error
	for _, d := range []string{c.dir, c.podDir} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Container) waitFor(ctx context.Context, cond func() bool) error {
	deadline := time.NewTimer(socketTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("timed out")
		case <-c.exited:
			return fmt.Errorf("exited: %w", c.waitErr)
		case <-tick.C:
		}
	}
	return nil
}

func isSocket(path string) bool {
	info, err := os.Lstat(path)
	return err == nil && info.Mode()&os.ModeSocket != 0
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
