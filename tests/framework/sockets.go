package framework

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerPID returns the PID the kernel reports for the other end of conn
// (SO_PEERCRED): for a client, the process listening on the socket, as
// virt-handler finds a container-disk program.
func PeerPID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("peer of %s: %w", conn.RemoteAddr(), credErr)
	}
	return int(cred.Pid), nil
}
