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

#define _POSIX_C_SOURCE 200809L

#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* How often the socket file is checked while no connection arrives. */
#define CHECK_INTERVAL_MS 1000

/*
 * Connections taken per wake-up before the signal flag and the socket file
 * are looked at again, so that a flood cannot hide either from the loop.
 */
#define ACCEPT_BATCH 1024

/* Set by the signal handler, read by the main loop. */
static volatile sig_atomic_t stop_signal;

/*
 * Self-pipe: the handler writes a byte to its write end so that poll() in
 * the main loop returns. Both ends are non-blocking.
 */
static int wake_read_fd = -1;
static volatile sig_atomic_t wake_write_fd = -1;

/*
 * The socket is bound under PATH + TEMP_SUFFIX and renamed to PATH.sock once
 * it listens, so that a client never finds a socket file that refuses
 * connections. The suffix is no longer than SOCKET_SUFFIX to fit sun_path.
 */
#define TEMP_SUFFIX ".new"
_Static_assert(sizeof(TEMP_SUFFIX) <= sizeof(SOCKET_SUFFIX),
	       "the temporary socket name must fit where PATH.sock fits");

struct server {
	char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char temp_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd;
	/* Whether socket_path is the file this process bound ... */
	bool bound;
	/* ... identified by these. */
	dev_t dev;
	ino_t ino;
};

size_t max_copy_path_len(void)
{
	return sizeof(((struct sockaddr_un *)0)->sun_path) -
	       strlen(SOCKET_SUFFIX) - 1;
}

void log_line(const char *format, ...)
{
	va_list args;
	char message[512];
	int n;

	va_start(args, format);
	n = vsnprintf(message, sizeof(message), format, args);
	va_end(args);
	if (n < 0) {
		message[0] = '\0';
	}
	/*
	 * Nothing sensible is left to do when stderr itself cannot be
	 * written; the exit status still reports the failure.
	 */
	n = fprintf(stderr, "%s: %s\n", PROGRAM_NAME, message);
	(void)n;
}

static void on_stop_signal(int signo)
{
	int saved_errno = errno;
	ssize_t n;

	stop_signal = signo;
	/* A full pipe already holds a pending wake-up: ignore EAGAIN. */
	n = write(wake_write_fd, "x", 1);
	(void)n;
	errno = saved_errno;
}

static int set_fd_flags(int fd)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags == -1 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) == -1) {
		return -1;
	}
	flags = fcntl(fd, F_GETFD);
	if (flags == -1 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == -1) {
		return -1;
	}
	return 0;
}

static void close_fd(int *fd, const char *what)
{
	if (*fd < 0) {
		return;
	}
	if (close(*fd) != 0) {
		log_line("close %s: %s", what, strerror(errno));
	}
	*fd = -1;
}

static int install_signal_handlers(void)
{
	static const int signals[] = { SIGTERM, SIGINT };
	struct sigaction action;
	int fds[2];
	size_t i;

	if (pipe(fds) != 0) {
		log_line("create wake-up pipe: %s", strerror(errno));
		return -1;
	}
	wake_read_fd = fds[0];
	wake_write_fd = fds[1];
	if (set_fd_flags(fds[0]) != 0 || set_fd_flags(fds[1]) != 0) {
		log_line("configure wake-up pipe: %s", strerror(errno));
		return -1;
	}

	memset(&action, 0, sizeof(action));
	action.sa_handler = on_stop_signal;
	/* No SA_RESTART: a signal should interrupt whatever blocks. */
	action.sa_flags = 0;
	if (sigemptyset(&action.sa_mask) != 0) {
		log_line("prepare signal mask: %s", strerror(errno));
		return -1;
	}
	for (i = 0; i < sizeof(signals) / sizeof(signals[0]); i++) {
		if (sigaction(signals[i], &action, NULL) != 0) {
			log_line("install handler for signal %d: %s",
				 signals[i], strerror(errno));
			return -1;
		}
	}
	/* A log line to a stderr pipe nobody reads must not kill us. */
	action.sa_handler = SIG_IGN;
	if (sigaction(SIGPIPE, &action, NULL) != 0) {
		log_line("ignore SIGPIPE: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static void drain_wake_pipe(void)
{
	char buf[64];

	while (read(wake_read_fd, buf, sizeof(buf)) > 0) {
		/* only the wake-up matters, not the bytes */
	}
}

/*
 * Creates every missing directory above path, like mkdir -p on its
 * dirname. A component that exists already is fine as long as it turns out
 * to be a directory.
 */
static int make_parent_dirs(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t len;
	struct stat st;
	char *p;

	if (slash == NULL || slash == path) {
		return 0; /* the parent is "." or "/" */
	}
	len = (size_t)(slash - path);
	if (len >= sizeof(dir)) {
		log_line("directory of %s is too long", path);
		return -1;
	}
	memcpy(dir, path, len);
	dir[len] = '\0';

	for (p = dir + 1;; p++) {
		char saved = *p;

		if (saved != '/' && saved != '\0') {
			continue;
		}
		*p = '\0';
		if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
			int mkdir_errno = errno;

			if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
				log_line("create directory %s: %s", dir,
					 strerror(mkdir_errno));
				return -1;
			}
		}
		*p = saved;
		if (saved == '\0') {
			break;
		}
	}

	if (stat(dir, &st) != 0) {
		log_line("inspect directory %s: %s", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		log_line("%s exists and is not a directory", dir);
		return -1;
	}
	return 0;
}

static void fill_address(struct sockaddr_un *addr, const char *path)
{
	memset(addr, 0, sizeof(*addr));
	addr->sun_family = AF_UNIX;
	/* The caller checked that path fits, NUL included. */
	memcpy(addr->sun_path, path, strlen(path) + 1);
}

/*
 * A socket file left behind by an earlier run that died without cleaning
 * up is removed. One that still has a listener, or anything that is not a
 * socket, is left alone and refused.
 */
static int remove_stale_socket(const char *path)
{
	struct sockaddr_un addr;
	struct stat st;
	int probe;
	int connect_errno;

	if (lstat(path, &st) != 0) {
		if (errno == ENOENT) {
			return 0;
		}
		log_line("inspect %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_line("%s exists and is not a socket; refusing to replace it",
			 path);
		return -1;
	}

	probe = socket(AF_UNIX, SOCK_STREAM, 0);
	if (probe == -1) {
		log_line("create probe socket: %s", strerror(errno));
		return -1;
	}
	if (set_fd_flags(probe) != 0) {
		log_line("configure probe socket: %s", strerror(errno));
		close_fd(&probe, "probe socket");
		return -1;
	}
	fill_address(&addr, path);
	connect_errno = 0;
	if (connect(probe, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		connect_errno = errno;
	}
	close_fd(&probe, "probe socket");

	switch (connect_errno) {
	case ECONNREFUSED:
		break; /* nobody listens: stale */
	case 0:
	case EAGAIN:
		log_line("another process is listening on %s", path);
		return -1;
	default:
		log_line("probe %s: %s", path, strerror(connect_errno));
		return -1;
	}

	if (unlink(path) != 0 && errno != ENOENT) {
		log_line("remove stale socket %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Binds and listens under the temporary name, then publishes the socket. */
static int start_listening(struct server *srv)
{
	struct sockaddr_un addr;
	struct stat st;

	srv->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (srv->listen_fd == -1) {
		log_line("create socket: %s", strerror(errno));
		return -1;
	}
	if (set_fd_flags(srv->listen_fd) != 0) {
		log_line("configure socket: %s", strerror(errno));
		return -1;
	}
	fill_address(&addr, srv->temp_path);
	if (bind(srv->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
		log_line("bind %s: %s", srv->temp_path, strerror(errno));
		return -1;
	}
	/*
	 * Any backlog above net.core.somaxconn is cut down to it by the
	 * kernel; libc's SOMAXCONN may be smaller than what the kernel allows.
	 */
	if (listen(srv->listen_fd, INT_MAX) != 0) {
		log_line("listen on %s: %s", srv->temp_path, strerror(errno));
		goto remove_temp;
	}
	/* rename() keeps the inode, so this identifies PATH.sock later. */
	if (lstat(srv->temp_path, &st) != 0) {
		log_line("inspect %s: %s", srv->temp_path, strerror(errno));
		goto remove_temp;
	}
	if (rename(srv->temp_path, srv->socket_path) != 0) {
		log_line("rename %s to %s: %s", srv->temp_path,
			 srv->socket_path, strerror(errno));
		goto remove_temp;
	}
	srv->dev = st.st_dev;
	srv->ino = st.st_ino;
	srv->bound = true;
	return 0;

remove_temp:
	if (unlink(srv->temp_path) != 0 && errno != ENOENT) {
		log_line("remove %s: %s", srv->temp_path, strerror(errno));
	}
	return -1;
}

enum socket_state { SOCKET_OURS, SOCKET_GONE, SOCKET_REPLACED, SOCKET_ERROR };

static enum socket_state check_socket_file(const struct server *srv)
{
	struct stat st;

	if (lstat(srv->socket_path, &st) != 0) {
		if (errno == ENOENT) {
			return SOCKET_GONE;
		}
		log_line("inspect %s: %s", srv->socket_path, strerror(errno));
		return SOCKET_ERROR;
	}
	if (st.st_dev != srv->dev || st.st_ino != srv->ino) {
		return SOCKET_REPLACED;
	}
	return SOCKET_OURS;
}

/* Removes the socket file, but only while it is still the one we bound. */
static int remove_own_socket(const struct server *srv)
{
	switch (check_socket_file(srv)) {
	case SOCKET_OURS:
		if (unlink(srv->socket_path) != 0 && errno != ENOENT) {
			log_line("remove %s: %s", srv->socket_path,
				 strerror(errno));
			return -1;
		}
		return 0;
	case SOCKET_GONE:
	case SOCKET_REPLACED:
		return 0;
	case SOCKET_ERROR:
	default:
		return -1;
	}
}

enum accept_result { ACCEPT_DRAINED, ACCEPT_MORE, ACCEPT_BACK_OFF, ACCEPT_FAILED };

/* Accepts and closes waiting connections until none is left. */
static enum accept_result accept_pending(const struct server *srv)
{
	int i;

	for (i = 0; i < ACCEPT_BATCH; i++) {
		int conn = accept(srv->listen_fd, NULL, NULL);

		if (conn >= 0) {
			close_fd(&conn, "connection");
			continue;
		}
		switch (errno) {
		case EAGAIN:
#if EWOULDBLOCK != EAGAIN
		case EWOULDBLOCK:
#endif
			return ACCEPT_DRAINED;
		case EINTR:
		case ECONNABORTED:
		case EPROTO:
			continue;
		case EMFILE:
		case ENFILE:
		case ENOBUFS:
		case ENOMEM:
			log_line("accept on %s: %s; retrying shortly",
				 srv->socket_path, strerror(errno));
			return ACCEPT_BACK_OFF;
		default:
			log_line("accept on %s: %s", srv->socket_path,
				 strerror(errno));
			return ACCEPT_FAILED;
		}
	}
	return ACCEPT_MORE;
}

static int run_loop(const struct server *srv)
{
	bool back_off = false;

	for (;;) {
		struct pollfd fds[2];
		nfds_t nfds;
		int ready;

		if (stop_signal != 0) {
			log_line("received %s, removing %s",
				 stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
				 srv->socket_path);
			return remove_own_socket(srv) == 0 ? STATUS_OK
							   : STATUS_FAILURE;
		}
		switch (check_socket_file(srv)) {
		case SOCKET_OURS:
			break;
		case SOCKET_GONE:
			log_line("%s was removed, exiting", srv->socket_path);
			return STATUS_OK;
		case SOCKET_REPLACED:
			log_line("%s was replaced by another file, exiting",
				 srv->socket_path);
			return STATUS_OK;
		case SOCKET_ERROR:
		default:
			return STATUS_FAILURE;
		}

		fds[0].fd = wake_read_fd;
		fds[0].events = POLLIN;
		fds[0].revents = 0;
		fds[1].fd = srv->listen_fd;
		fds[1].events = POLLIN;
		fds[1].revents = 0;
		/* While backing off, wait a full interval before accepting. */
		nfds = back_off ? 1 : 2;
		back_off = false;

		ready = poll(fds, nfds, CHECK_INTERVAL_MS);
		if (ready == -1) {
			if (errno == EINTR) {
				continue;
			}
			log_line("wait for connections: %s", strerror(errno));
			return STATUS_FAILURE;
		}
		if (fds[0].revents != 0) {
			drain_wake_pipe();
		}
		if (nfds < 2 || fds[1].revents == 0) {
			continue;
		}
		if ((fds[1].revents & POLLIN) == 0) {
			log_line("socket %s failed (poll events 0x%x)",
				 srv->socket_path, (unsigned)fds[1].revents);
			return STATUS_FAILURE;
		}
		switch (accept_pending(srv)) {
		case ACCEPT_DRAINED:
		case ACCEPT_MORE:
			break;
		case ACCEPT_BACK_OFF:
			back_off = true;
			break;
		case ACCEPT_FAILED:
		default:
			return STATUS_FAILURE;
		}
	}
}

int serve(const char *copy_path)
{
	struct server srv;
	size_t len = strlen(copy_path);
	int status = STATUS_FAILURE;

	/* main() has checked the length; this keeps the copy below safe. */
	if (len == 0 || len > max_copy_path_len()) {
		log_line("copy path must be 1 to %zu bytes long",
			 max_copy_path_len());
		return STATUS_USAGE;
	}
	memset(&srv, 0, sizeof(srv));
	memcpy(srv.socket_path, copy_path, len);
	memcpy(srv.socket_path + len, SOCKET_SUFFIX, sizeof(SOCKET_SUFFIX));
	memcpy(srv.temp_path, copy_path, len);
	memcpy(srv.temp_path + len, TEMP_SUFFIX, sizeof(TEMP_SUFFIX));
	srv.listen_fd = -1;

	/* Handlers first: a SIGTERM after bind must not leave the file. */
	if (install_signal_handlers() != 0) {
		goto out;
	}
	if (make_parent_dirs(srv.socket_path) != 0) {
		goto out;
	}
	if (remove_stale_socket(srv.socket_path) != 0 ||
	    remove_stale_socket(srv.temp_path) != 0) {
		goto out;
	}
	if (start_listening(&srv) != 0) {
		goto out;
	}
	status = run_loop(&srv);
	/* run_loop removed the file already, or it is no longer ours. */
	srv.bound = false;

out:
	/* A step after bind failed: take the file away again. */
	if (srv.bound && remove_own_socket(&srv) != 0) {
		status = STATUS_FAILURE;
	}
	close_fd(&srv.listen_fd, "listening socket");
	close_fd(&wake_read_fd, "wake-up pipe");
	if (wake_write_fd >= 0) {
		int fd = wake_write_fd;

		/* From here on the handler's write fails harmlessly (EBADF). */
		wake_write_fd = -1;
		close_fd(&fd, "wake-up pipe");
	}
	return status;
}
