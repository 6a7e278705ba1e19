/*
 * The listening half of container-disk: it owns PATH.sock from bind until
 * exit and answers every connection by closing it.
 */
#ifndef CONTAINERDISK_SERVER_H
#define CONTAINERDISK_SERVER_H

#include <stddef.h>

#define PROGRAM_NAME "container-disk"
#define SOCKET_SUFFIX ".sock"

/* Exit statuses; README.md documents them for operators. */
enum exit_status {
	STATUS_OK = 0,      /* --no-op, --help, a stop signal, socket gone */
	STATUS_FAILURE = 1, /* something at run time failed */
	STATUS_USAGE = 2,   /* the command line is wrong */
};

/*
 * The longest copy path accepted: PATH plus ".sock" plus the terminating
 * NUL must fit in sockaddr_un.sun_path.
 */
size_t max_copy_path_len(void);

/* Prints "container-disk: <message>" as one line on stderr. */
void log_line(const char *format, ...)
	__attribute__((format(printf, 1, 2)));

/*
 * Creates the parent directory of copy_path if needed, listens on
 * copy_path.sock and serves until a stop signal arrives or the socket file
 * is removed or replaced. Returns an enum exit_status.
 */
int serve(const char *copy_path);

#endif
