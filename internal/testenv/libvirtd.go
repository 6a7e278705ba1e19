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
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Libvirtd is a private libvirtd for a test suite, never the machine's
// system instance. It runs in its own mount namespace where its own
// directories are bind-mounted over /etc/libvirt, /run, /var/lib/libvirt,
// /var/log/libvirt and /var/cache/libvirt, so it finds its configuration and
// keeps its sockets, state and logs under Dir().
//
// Mount propagation: the namespace is created with `unshare --propagation
// slave`. Slave keeps the daemon's bind mounts from propagating back to the
// host (with "unchanged" they would land on a shared host / and hide the
// host's /run), while mounts the host makes later still reach the namespace
// beneath mounts that are shared on the host. Machines differ there (a
// container's / is often private), so the daemon gets one dependable
// channel: SharedDir() is a shared bind mount made before the namespace, so
// whatever a test mounts beneath it on the host (a disk image to hotplug,
// say) QEMU sees at the same path. For anything else, NamespaceCommand runs
// a command inside the namespace.
type Libvirtd struct {
	dir      string
	virtType string
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	// mntNS identifies the daemon's mount namespace ("mnt:[inode]"); every
	// process in it was started by this daemon.
	mntNS string

	stopped  atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

//go:embed libvirtd-ns.sh
var libvirtdNSScript string

// The daemon's directories under Dir() and what they cover in its namespace.
var libvirtdPrivateDirs = map[string]string{
	"etc":   "/etc/libvirt",
	"run":   "/run",
	"lib":   "/var/lib/libvirt",
	"log":   "/var/log/libvirt",
	"cache": "/var/cache/libvirt",
}

const libvirtdConf = `# Private test daemon: clients on the UNIX socket need no authentication.
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:stderr"
`

// Works without systemd or a system user: QEMU runs as root, libvirt
// changes no ownership, labels and cgroups, and QEMU writes the serial
// files itself (no virtlogd).
const qemuConf = `user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = []
cgroup_controllers = []
stdio_handler = "file"
`

// The kernel's limit on a UNIX socket path, terminator included.
const maxSocketPath = 108

// libvirtdStopGrace is how long libvirtd gets to exit on SIGTERM.
const libvirtdStopGrace = 10 * time.Second

// StartLibvirtd starts a private libvirtd and returns once its socket
// answers (the first answer includes QEMU capability probing, several
// seconds). Call Stop when done, also after a failure, e.g. with
// DeferCleanup(d.Stop).
func StartLibvirtd(ctx context.Context) (*Libvirtd, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a private libvirtd needs root (mount namespace, bind mounts)")
	}
	dir, err := os.MkdirTemp("", "libvirtd-")
	if err != nil {
		return nil, fmt.Errorf("create private libvirtd dir: %w", err)
	}
	d := &Libvirtd{dir: dir, exited: make(chan struct{})}
	if err := d.start(ctx); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), libvirtdStopGrace+20*time.Second)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("start libvirtd in %s: %w", dir, err), d.Stop(cleanupCtx))
	}
	return d, nil
}

func (d *Libvirtd) start(ctx context.Context) error {
	virtType, err := chooseVirtType()
	if err != nil {
		return err
	}
	d.virtType = virtType
	for sub, covered := range libvirtdPrivateDirs {
		if within(d.dir, covered) {
			return fmt.Errorf("private dir %s lies under %s, which the daemon's namespace covers; set TMPDIR elsewhere", d.dir, covered)
		}
		if err := os.MkdirAll(filepath.Join(d.dir, sub), 0o755); err != nil {
			return err
		}
	}
	if n := len(d.socket()); n >= maxSocketPath {
		return fmt.Errorf("socket path %s is %d bytes, too long for a UNIX socket; set a shorter TMPDIR", d.socket(), n)
	}
	for _, f := range []struct{ path, content string }{
		{filepath.Join(d.dir, "etc", "libvirtd.conf"), libvirtdConf},
		{filepath.Join(d.dir, "etc", "qemu.conf"), qemuConf},
		{filepath.Join(d.dir, "ns.sh"), libvirtdNSScript},
	} {
		if err := os.WriteFile(f.path, []byte(f.content), 0o644); err != nil {
			return err
		}
	}
	for _, sub := range []string{"shared", "domains"} {
		if err := os.Mkdir(filepath.Join(d.dir, sub), 0o755); err != nil {
			return err
		}
	}
	if err := makeSharedBindMount(d.SharedDir()); err != nil {
		return err
	}

	logFile, err := os.OpenFile(d.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"--mount", "--propagation", "slave", "--", "bash", filepath.Join(d.dir, "ns.sh"), d.dir}
	for sub, covered := range libvirtdPrivateDirs {
		args = append(args, sub+":"+covered)
	}
	d.cmd = exec.Command("unshare", args...)
	d.cmd.Stdout = logFile
	d.cmd.Stderr = logFile
	// Its own process group keeps a terminal's ^C for Ginkgo, which then
	// runs Stop; the parent-death signal ends the daemon if the test binary
	// dies without cleaning up (its QEMU processes stay: nothing tells them).
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	started := make(chan error)
	go func() {
		// The kernel sends the parent-death signal when the forking
		// thread exits: keep this thread to this goroutine while the
		// daemon lives.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(d.exited)
		if err := d.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		d.waitErr = d.cmd.Wait()
	}()
	if err := <-started; err != nil {
		return err
	}

	var lastErr error
	answered := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		select {
		case <-d.exited:
			return false, fmt.Errorf("libvirtd exited (%w): %s", d.waitErr, d.logTail())
		default:
		}
		_, lastErr = d.Virsh(ctx, "version")
		return lastErr == nil, nil
	})
	if answered != nil {
		return fmt.Errorf("wait for socket %s: %w (last attempt: %v)", d.socket(), answered, lastErr) //nolint:errorlint // the first error is the cause; the second, only told
	}

	return d.learnNamespace()
}

// learnNamespace records the daemon's mount namespace, refusing the test's
// own: Stop kills every process in it.
func (d *Libvirtd) learnNamespace() error {
	ns, err := mountNamespace(d.cmd.Process.Pid)
	if err != nil {
		return err
	}
	own, err := mountNamespace(os.Getpid())
	if err != nil {
		return err
	}
	if ns == own {
		return fmt.Errorf("libvirtd (pid %d) runs in the test's own mount namespace", d.cmd.Process.Pid)
	}
	d.mntNS = ns
	return nil
}

// Stop destroys the daemon's domains, stops it and kills whatever else still
// runs in its mount namespace (QEMU), then removes its directory. It is
// safe to call more than once and after a failed start.
func (d *Libvirtd) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() {
		d.stopped.Store(true)
		d.stopErr = d.stop(ctx)
	})
	return d.stopErr
}

func (d *Libvirtd) stop(ctx context.Context) error {
	var errs []error
	if d.cmd != nil && d.cmd.Process != nil {
		if d.mntNS == "" && d.alive() {
			// A start that failed early: QEMU can only be there if
			// libvirtd already entered its namespace.
			_ = d.learnNamespace()
		}
		if d.alive() && d.mntNS != "" {
			errs = append(errs, d.destroyDomains(ctx))
		}
		errs = append(errs, d.stopDaemon(ctx))
	}
	if d.mntNS != "" {
		errs = append(errs, d.killNamespace(ctx))
	}
	if err := unix.Unmount(d.SharedDir(), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", d.SharedDir(), err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop libvirtd in %s: %w", d.dir, err)
	}
	// Never remove through a mount that is still there.
	mounts, err := MountPoints()
	if err != nil {
		return fmt.Errorf("stop libvirtd in %s: %w", d.dir, err)
	}
	for _, m := range mounts {
		if within(m.MountPoint, d.dir) {
			return fmt.Errorf("stop libvirtd in %s: %s is still mounted, leaving the directory", d.dir, m.MountPoint)
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		return fmt.Errorf("stop libvirtd: %w", err)
	}
	return nil
}

func (d *Libvirtd) destroyDomains(ctx context.Context) error {
	out, err := d.Virsh(ctx, "list", "--name", "--state-running", "--state-paused")
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range strings.Fields(out) {
		if _, err := d.Virsh(ctx, "destroy", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (d *Libvirtd) stopDaemon(ctx context.Context) error {
	if !d.alive() {
		return nil
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal libvirtd: %w", err)
	}
	grace := time.NewTimer(libvirtdStopGrace)
	defer grace.Stop()
	select {
	case <-d.exited:
		return nil
	case <-grace.C:
	case <-ctx.Done():
	}
	if err := d.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill libvirtd: %w", err)
	}
	select {
	case <-d.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for libvirtd to exit: %w", ctx.Err())
	}
}

// killNamespace kills what is left in the daemon's mount namespace (QEMU,
// which libvirt daemonizes away from libvirtd) and waits until it is gone.
func (d *Libvirtd) killNamespace(ctx context.Context) error {
	return poll(ctx, 100*time.Millisecond, func() (bool, error) {
		pids, err := d.Processes()
		if err != nil {
			return false, err
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return false, fmt.Errorf("kill pid %d: %w", pid, err)
			}
		}
		return len(pids) == 0, nil
	})
}

// Processes lists the live processes in the daemon's mount namespace:
// libvirtd and the QEMU processes it started.
func (d *Libvirtd) Processes() ([]int, error) {
	if d.mntNS == "" {
		return nil, errors.New("the daemon's mount namespace is unknown")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// Processes that exit meanwhile, and zombies, have no readable
		// namespace: nothing left to kill.
		if ns, err := mountNamespace(pid); err == nil && ns == d.mntNS {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func (d *Libvirtd) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// URI is the connection URI for libvirt clients (LIBVIRT_DEFAULT_URI).
func (d *Libvirtd) URI() string {
	return "qemu:///system?socket=" + d.socket()
}

func (d *Libvirtd) socket() string {
	return filepath.Join(d.dir, "run", "libvirt", "libvirt-sock")
}

// Dir is the daemon's private directory (configuration, state, logs).
func (d *Libvirtd) Dir() string {
	return d.dir
}

// SharedDir is a directory beneath which mounts made on the host after the
// start also appear in the daemon's mount namespace, at the same path.
func (d *Libvirtd) SharedDir() string {
	return filepath.Join(d.dir, "shared")
}

// LogFile is where libvirtd logs (warnings and errors).
func (d *Libvirtd) LogFile() string {
	return filepath.Join(d.dir, "libvirtd.log")
}

// Pid is libvirtd's process id.
func (d *Libvirtd) Pid() int {
	return d.cmd.Process.Pid
}

// VirtType is the libvirt domain type NewDomain gives guests: "kvm" when
// /dev/kvm can create a VM, else "qemu" (TCG); VirtTypeEnv overrides it.
func (d *Libvirtd) VirtType() string {
	return d.virtType
}

// Virsh runs virsh against the private daemon and returns its output.
func (d *Libvirtd) Virsh(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "virsh", append([]string{"--connect", d.URI()}, args...)...)
}

// NamespaceCommand returns a command that runs inside the daemon's mount
// namespace, where QEMU sees the files and mounts it sees.
func (d *Libvirtd) NamespaceCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(d.Pid()), "--mount", "--", name}, args...)...)
}

// Mounts lists the mounts of the daemon's namespace.
func (d *Libvirtd) Mounts() ([]Mount, error) {
	return ReadMountInfo(fmt.Sprintf("/proc/%d/mountinfo", d.Pid()))
}

func (d *Libvirtd) logTail() string {
	const limit = 2000
	log, err := os.ReadFile(d.LogFile())
	if err != nil {
		return err.Error()
	}
	if len(log) > limit {
		log = log[len(log)-limit:]
	}
	return strings.TrimSpace(string(log))
}

func makeSharedBindMount(path string) error {
	if err := unix.Mount(path, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", path, err)
	}
	return nil
}

func mountNamespace(pid int) (string, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return "", fmt.Errorf("mount namespace of pid %d: %w", pid, err)
	}
	return ns, nil
}

// VirtTypeEnv names the environment variable that chooses the guests'
// domain type, "kvm" or "qemu", instead of detection. Nested KVM without
// hardware virtualization can run the BIOS far slower than TCG.
const VirtTypeEnv = "FUNCTIONAL_VIRT_TYPE"

func chooseVirtType() (string, error) {
	detected := detectVirtType()
	switch want := os.Getenv(VirtTypeEnv); want {
	case "":
		return detected, nil
	case "qemu":
		return want, nil
	case "kvm":
		if detected != "kvm" {
			return "", fmt.Errorf("%s=kvm, but /dev/kvm cannot create a VM", VirtTypeEnv)
		}
		return want, nil
	default:
		return "", fmt.Errorf("%s=%q, want kvm or qemu", VirtTypeEnv, want)
	}
}

// detectVirtType checks that /dev/kvm answers with the stable API and can
// create a VM.
func detectVirtType() string {
	const (
		kvmGetAPIVersion = 0xae00
		kvmCreateVM      = 0xae01
		kvmAPIVersion    = 12
	)
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "qemu"
	}
	defer f.Close()
	if v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion); err != nil || v != kvmAPIVersion {
		return "qemu"
	}
	vm, err := unix.IoctlRetInt(int(f.Fd()), kvmCreateVM)
	if err != nil {
		return "qemu"
	}
	unix.Close(vm)
	return "kvm"
}

// within reports whether path is base or lies beneath it.
func within(path, base string) bool {
	rel, err := filepath.Rel(base, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// poll calls check every interval until it reports done, fails, or ctx
// ends.
func poll(ctx context.Context, interval time.Duration, check func() (bool, error)) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		done, err := check()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
