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
