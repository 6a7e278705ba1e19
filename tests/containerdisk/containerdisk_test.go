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

package containerdisk_test

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
)

const (
	// maxCopyPath is the longest --copy-path: PATH + ".sock" + NUL fill
	// the 108 bytes of sockaddr_un.sun_path on Linux.
	maxCopyPath = 108 - len(".sock") - 1

	// exitTimeout bounds waiting for an exit the program notices by
	// polling its socket file, which it does about once a second.
	exitTimeout = 10 * time.Second

	burst = 1000
)

// shortTempDir makes a directory with a short path, so that socket paths
// under it stay well inside sun_path, and removes it after the spec.
func shortTempDir() string {
	dir, err := os.MkdirTemp("", "cd")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	Expect(len(dir)).To(BeNumerically("<", 60), "temporary directory %s is too long for socket paths", dir)
	return dir
}

// start runs the program in dir and kills it after the spec if it is
// still running.
func start(dir string, args ...string) *gexec.Session {
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	session, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		session.Kill().Wait(exitTimeout)
	})
	return session
}

// run starts the program and waits until it exits.
func run(dir string, args ...string) *gexec.Session {
	session := start(dir, args...)
	Eventually(session).WithTimeout(exitTimeout).Should(gexec.Exit())
	return session
}

// expectOneErrorLine checks that stderr holds exactly one line, from the
// program, containing want.
func expectOneErrorLine(session *gexec.Session, want string) {
	stderr := string(session.Err.Contents())
	Expect(stderr).To(HavePrefix("container-disk: "))
	Expect(stderr).To(ContainSubstring(want))
	Expect(strings.Count(stderr, "\n")).To(Equal(1), "stderr: %q", stderr)
	Expect(stderr).To(HaveSuffix("\n"))
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

func dirEntries(dir string) []string {
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// peerPID connects to socket the way virt-handler does, and returns the
// PID the kernel reports for the listening end. The connection must be
// closed by the program with nothing sent.
func peerPID(socket string) (int, error) {
	conn, err := testenv.DialUnix(socket)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	pid, err := testenv.PeerPID(conn)
	if err != nil {
		return 0, err
	}
	if err := expectEOF(conn); err != nil {
		return 0, err
	}
	return pid, nil
}

// expectEOF reads from conn and reports anything but an immediate EOF.
func expectEOF(conn net.Conn) error {
	if err := conn.SetReadDeadline(time.Now().Add(exitTimeout)); err != nil {
		return err
	}
	buf := make([]byte, 16)
	n, err := conn.Read(buf)
	if n != 0 {
		return errors.New("the program sent data: " + strconv.Quote(string(buf[:n])))
	}
	if !errors.Is(err, io.EOF) {
		return errors.New("expected EOF, got: " + errorString(err))
	}
	return nil
}

func errorString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// dialAndExpectEOF is one client of a burst.
func dialAndExpectEOF(socket string) error {
	conn, err := testenv.DialUnix(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	return expectEOF(conn)
}

func openFDs(pid int) int {
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	Expect(err).NotTo(HaveOccurred())
	return len(entries)
}

// procState returns the one-letter state and the parent PID of pid.
func procState(pid int) (string, int, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, err
	}
	// The command name in parentheses may hold spaces: parse after it.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 2 {
		return "", 0, errors.New("short /proc stat line")
	}
	ppid, err := strconv.Atoi(fields[1])
	return fields[0], ppid, err
}

// childrenOf lists the processes, zombies included, whose parent is pid.
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	var children []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, err := procState(child); err == nil && ppid == pid {
			children = append(children, child)
		}
	}
	return children
}

// somaxconn is the kernel's cap on a listen backlog.
func somaxconn() int {
	data, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	Expect(err).NotTo(HaveOccurred())
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	Expect(err).NotTo(HaveOccurred())
	return n
}

var _ = Describe("container-disk", func() {
	var dir string

	BeforeEach(func() {
		dir = shortTempDir()
	})

	Context("command line", func() {
		It("exits 0 at once for --no-op and creates nothing", func() {
			session := run(dir, "--no-op")
			Expect(session).To(gexec.Exit(0))
			Expect(session.Err.Contents()).To(BeEmpty())
			Expect(dirEntries(dir)).To(BeEmpty())
		})

		It("prints its usage for --help", func() {
			for _, flag := range []string{"--help", "-h"} {
				session := run(dir, flag)
				Expect(session).To(gexec.Exit(0))
				Expect(session.Out).To(gbytes.Say(`--copy-path PATH`))
				Expect(session.Out).To(gbytes.Say(`--no-op`))
				Expect(session.Out).To(gbytes.Say(`at most 102 bytes`))
				Expect(session.Err.Contents()).To(BeEmpty())
			}
		})

		DescribeTable("refuses a wrong command line with one error line and status 2",
			func(args []string, want string) {
				session := run(dir, args...)
				Expect(session).To(gexec.Exit(2))
				expectOneErrorLine(session, want)
				Expect(dirEntries(dir)).To(BeEmpty())
			},
			Entry("without arguments", nil, "--copy-path or --no-op is required"),
			Entry("with an unknown long option", []string{"--copy-path", "disk", "--verbose"}, "unknown option '--verbose'"),
			Entry("with an unknown short option", []string{"-x"}, "unknown option '-x'"),
			Entry("with --copy-path lacking its value", []string{"--copy-path"}, "option '--copy-path' needs a value"),
			Entry("with an empty --copy-path", []string{"--copy-path", ""}, "--copy-path must not be empty"),
			Entry("with a value for --no-op", []string{"--no-op=yes"}, "option '--no-op=yes' takes no value"),
			Entry("with a stray argument", []string{"--copy-path", "disk", "extra"}, "unexpected argument 'extra'"),
		)

		It("refuses a copy path too long for a unix socket, naming the limit", func() {
			path := filepath.Join(dir, strings.Repeat("d", maxCopyPath-len(dir)))
			Expect(path).To(HaveLen(maxCopyPath + 1))

			session := run(dir, "--copy-path", path)
			Expect(session).To(gexec.Exit(2))
			expectOneErrorLine(session, "copy path is 103 bytes long, the limit is 102")
			Expect(dirEntries(dir)).To(BeEmpty())
		})

		It("accepts a copy path of exactly the limit", func() {
			path := filepath.Join(dir, strings.Repeat("d", maxCopyPath-len(dir)-1))
			Expect(path).To(HaveLen(maxCopyPath))

			session := start(dir, "--copy-path", path)
			Eventually(func() (int, error) { return peerPID(path + ".sock") }).
				Should(Equal(session.Command.Process.Pid))
		})
	})

	DescribeTable("listens for every spelling of --copy-path",
		func(args func(path string) []string) {
			path := filepath.Join(dir, "disk_0")
			session := start(dir, args(path)...)
			Eventually(func() (int, error) { return peerPID(path + ".sock") }).
				Should(Equal(session.Command.Process.Pid))
		},
		Entry("--copy-path PATH", func(path string) []string { return []string{"--copy-path", path} }),
		Entry("--copy-path=PATH", func(path string) []string { return []string{"--copy-path=" + path} }),
		Entry("-c PATH", func(path string) []string { return []string{"-c", path} }),
		Entry("a relative PATH", func(string) []string { return []string{"--copy-path", "disk_0"} }),
	)

	Context("refusing to start", func() {
		It("leaves a file that is not a socket alone", func() {
			socket := filepath.Join(dir, "disk_0.sock")
			Expect(os.WriteFile(socket, []byte("precious"), 0o644)).To(Succeed())

			session := run(dir, "--copy-path", filepath.Join(dir, "disk_0"))
			Expect(session).To(gexec.Exit(1))
			expectOneErrorLine(session, socket+" exists and is not a socket")
			Expect(os.ReadFile(socket)).To(Equal([]byte("precious")))
		})

		It("leaves a file at the temporary name that is not a socket alone", func() {
			temp := filepath.Join(dir, "disk_0.new")
			Expect(os.WriteFile(temp, []byte("precious"), 0o644)).To(Succeed())

			session := run(dir, "--copy-path", filepath.Join(dir, "disk_0"))
			Expect(session).To(gexec.Exit(1))
			expectOneErrorLine(session, temp+" exists and is not a socket")
			Expect(dirEntries(dir)).To(ConsistOf("disk_0.new"))
		})

		It("reports a parent path that is a file", func() {
			parent := filepath.Join(dir, "file")
			Expect(os.WriteFile(parent, nil, 0o644)).To(Succeed())

			session := run(dir, "--copy-path", filepath.Join(parent, "disk_0"))
			Expect(session).To(gexec.Exit(1))
			expectOneErrorLine(session, parent+" exists and is not a directory")
		})
	})

	DescribeTable("replaces a stale socket file from an earlier run and serves",
		func(name string) {
			stale := filepath.Join(dir, name)
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			Expect(err).NotTo(HaveOccurred())
			Expect(syscall.Bind(fd, &syscall.SockaddrUnix{Name: stale})).To(Succeed())
			Expect(syscall.Close(fd)).To(Succeed())
			Expect(isSocket(stale)).To(BeTrue())

			socket := filepath.Join(dir, "disk_0.sock")
			session := start(dir, "--copy-path", filepath.Join(dir, "disk_0"))
			Eventually(func() (int, error) { return peerPID(socket) }).
				Should(Equal(session.Command.Process.Pid))
			Expect(dirEntries(dir)).To(ConsistOf("disk_0.sock"))
		},
		Entry("at PATH.sock", "disk_0.sock"),
		Entry("at the temporary PATH.new", "disk_0.new"),
	)

	It("never shows a socket file that refuses connections", func() {
		// The file appears by rename once the socket listens, so the
		// first connection after it shows up must already be accepted.
		for i := 0; i < 20; i++ {
			socket := filepath.Join(dir, "run"+strconv.Itoa(i)+".sock")
			session := start(dir, "--copy-path", strings.TrimSuffix(socket, ".sock"))
			Eventually(func() bool { return isSocket(socket) }).WithPolling(time.Millisecond).Should(BeTrue())
			Expect(peerPID(socket)).To(Equal(session.Command.Process.Pid), "run %d", i)
			session.Terminate()
			Eventually(session).WithTimeout(exitTimeout).Should(gexec.Exit(0))
		}
		Expect(dirEntries(dir)).To(BeEmpty())
	})

	Context("while serving", func() {
		var (
			copyPath string
			socket   string
			session  *gexec.Session
			pid      int
		)

		BeforeEach(func() {
			// The directories above the socket do not exist yet.
			copyPath = filepath.Join(dir, "hotplug", "tools", "disk_0")
			socket = copyPath + ".sock"
			session = start(dir, "--copy-path", copyPath)
			pid = session.Command.Process.Pid
			Eventually(func() bool { return isSocket(socket) }).Should(BeTrue())
		})

		It("tells a client its PID and closes the connection", func() {
			Expect(peerPID(socket)).To(Equal(pid))
			Expect(session).NotTo(gexec.Exit())
			Expect(session.Err.Contents()).To(BeEmpty())
		})

		DescribeTable("exits 0 on a stop signal and removes its socket",
			func(sig syscall.Signal, name string) {
				session.Signal(sig)
				Eventually(session).WithTimeout(exitTimeout).Should(gexec.Exit(0))
				Expect(dirEntries(filepath.Dir(socket))).To(BeEmpty())
				expectOneErrorLine(session, "received "+name+", removing "+socket)
			},
			Entry("SIGTERM", syscall.SIGTERM, "SIGTERM"),
			Entry("SIGINT", syscall.SIGINT, "SIGINT"),
		)

		It("exits 0 when its socket file is removed", func() {
			Expect(os.Remove(socket)).To(Succeed())
			Eventually(session).WithTimeout(exitTimeout).Should(gexec.Exit(0))
			expectOneErrorLine(session, socket+" was removed, exiting")
		})

		It("exits 0 when its socket file is replaced, keeping the new file", func() {
			Expect(os.Remove(socket)).To(Succeed())
			Expect(os.WriteFile(socket, []byte("new"), 0o644)).To(Succeed())
			Eventually(session).WithTimeout(exitTimeout).Should(gexec.Exit(0))
			expectOneErrorLine(session, socket+" was replaced by another file, exiting")
			Expect(os.ReadFile(socket)).To(Equal([]byte("new")))
		})

		It("refuses a second instance on the same socket and keeps serving", func() {
			second := run(dir, "--copy-path", copyPath)
			Expect(second).To(gexec.Exit(1))
			expectOneErrorLine(second, "another process is listening on "+socket)
			Expect(peerPID(socket)).To(Equal(pid))
		})

		Context("under a burst of connections", func() {
			var fdsBefore int

			BeforeEach(func() {
				fdsBefore = openFDs(pid)
			})

			AfterEach(func() {
				Eventually(func() int { return openFDs(pid) }).Should(Equal(fdsBefore), "leaked file descriptors")
				Expect(childrenOf(pid)).To(BeEmpty(), "the program has child processes")
				state, _, err := procState(pid)
				Expect(err).NotTo(HaveOccurred())
				Expect(state).NotTo(Equal("Z"))
				Expect(session).NotTo(gexec.Exit())
				Expect(session.Err.Contents()).To(BeEmpty())
			})

			It("serves 1000 connections one after another", func() {
				for i := 0; i < burst; i++ {
					Expect(dialAndExpectEOF(socket)).To(Succeed(), "connection %d", i)
				}
			})

			It("serves 1000 connections opened at the same moment, none refused for a full backlog", func() {
				var wg sync.WaitGroup
				errs := make(chan error, burst)
				gate := make(chan struct{})
				for i := 0; i < burst; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-gate
						if err := dialAndExpectEOF(socket); err != nil {
							errs <- err
						}
					}()
				}
				close(gate)
				wg.Wait()
				close(errs)
				var failures []string
				for err := range errs {
					failures = append(failures, err.Error())
				}
				Expect(failures).To(BeEmpty())
			})

			It("keeps draining when more clients connect than its backlog holds", func() {
				// Blocking connects wait while the backlog is full, so
				// they all complete only if the program keeps accepting.
				n := somaxconn() + 100
				type result struct {
					fds []int
					err error
				}
				connected := make(chan result, 1)
				go func() {
					var r result
					defer func() { connected <- r }()
					for i := 0; i < n; i++ {
						fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
						if err != nil {
							r.err = err
							return
						}
						r.fds = append(r.fds, fd)
						// Bounds the reads below should a connection never be closed.
						timeout := syscall.Timeval{Sec: int64(exitTimeout / time.Second)}
						if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &timeout); err != nil {
							r.err = err
							return
						}
						if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: socket}); err != nil {
							r.err = err
							return
						}
					}
				}()
				var r result
				Eventually(connected).WithTimeout(time.Minute).Should(Receive(&r))
				fds := r.fds
				DeferCleanup(func() {
					for _, fd := range fds {
						_ = syscall.Close(fd)
					}
				})
				Expect(r.err).NotTo(HaveOccurred())
				Expect(fds).To(HaveLen(n))

				// Every connection was accepted and closed: each reads EOF.
				buf := make([]byte, 1)
				for i, fd := range fds {
					read, err := syscall.Read(fd, buf)
					Expect(err).NotTo(HaveOccurred(), "connection %d", i)
					Expect(read).To(BeZero(), "connection %d", i)
				}
			})
		})
	})
})
