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
 * container-disk: the process a KubeVirt containerDisk or hotplug
 * attachment container runs. It holds a unix socket at PATH.sock so that
 * virt-handler can find the container (and from the peer credentials its
 * process and root filesystem) and keeps the container alive until it is
 * told to stop.
 */
#define _POSIX_C_SOURCE 200809L

#include "server.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char usage_text[] =
	"Usage: " PROGRAM_NAME " --copy-path PATH\n"
	"       " PROGRAM_NAME " --no-op\n"
	"       " PROGRAM_NAME " --help\n"
	"\n"
	"Marks a KubeVirt containerDisk or hotplug container with the unix\n"
	"socket PATH.sock and keeps it running. Every connection is accepted\n"
	"and closed at once; virt-handler connects to learn which process, and\n"
	"so which container, serves the disk.\n"
	"\n"
	"  -c, --copy-path PATH  listen on PATH.sock, creating missing parent\n"
	"                        directories; PATH is at most %zu bytes long\n"
	"      --no-op           exit at once with status 0\n"
	"  -h, --help            print this help and exit\n"
	"\n"
	"Exit status: 0 after SIGTERM or SIGINT (the socket is removed first),\n"
	"when PATH.sock is removed or replaced, for --no-op and --help;\n"
	"1 when something fails at run time; 2 for a wrong command line.\n";

enum { OPT_NO_OP = 256 };

struct options {
	const char *copy_path;
	bool no_op;
	bool help;
};

static int print_usage(void)
{
	if (printf(usage_text, max_copy_path_len()) < 0 || fflush(stdout) != 0) {
		log_line("write help: %s", strerror(errno));
		return STATUS_FAILURE;
	}
	return STATUS_OK;
}

/* Fills opts from argv; on a usage error prints one line and returns -1. */
static int parse_args(int argc, char **argv, struct options *opts)
{
	static const struct option long_options[] = {
		{ "copy-path", required_argument, NULL, 'c' },
		{ "no-op", no_argument, NULL, OPT_NO_OP },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	memset(opts, 0, sizeof(*opts));
	opterr = 0; /* errors are reported below, in one line each */
	while ((c = getopt_long(argc, argv, ":c:h", long_options, NULL)) != -1) {
		const char *arg = argv[optind - 1];

		switch (c) {
		case 'c':
			opts->copy_path = optarg;
			break;
		case OPT_NO_OP:
			opts->no_op = true;
			break;
		case 'h':
			opts->help = true;
			break;
		case ':':
			log_line("option '%s' needs a value (see --help)", arg);
			return -1;
		case '?':
		default:
			if (strncmp(arg, "--", 2) != 0 && optopt > 0 &&
			    optopt < 256) {
				log_line("unknown option '-%c' (see --help)",
					 optopt);
			} else if (optopt != 0) {
				log_line("option '%s' takes no value "
					 "(see --help)", arg);
			} else {
				log_line("unknown option '%s' (see --help)",
					 arg);
			}
			return -1;
		}
	}
	if (optind < argc) {
		log_line("unexpected argument '%s' (see --help)", argv[optind]);
		return -1;
	}
	if (opts->help || opts->no_op) {
		return 0;
	}
	if (opts->copy_path == NULL) {
		log_line("--copy-path or --no-op is required (see --help)");
		return -1;
	}
	if (opts->copy_path[0] == '\0') {
		log_line("--copy-path must not be empty");
		return -1;
	}
	if (strlen(opts->copy_path) > max_copy_path_len()) {
		log_line("copy path is %zu bytes long, the limit is %zu: "
			 "PATH" SOCKET_SUFFIX " must fit the %zu bytes of a "
			 "unix socket address (sun_path) with its final NUL",
			 strlen(opts->copy_path), max_copy_path_len(),
			 max_copy_path_len() + strlen(SOCKET_SUFFIX) + 1);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options opts;

	if (parse_args(argc, argv, &opts) != 0) {
		return STATUS_USAGE;
	}
	if (opts.help) {
		return print_usage();
	}
	if (opts.no_op) {
		return STATUS_OK;
	}
	return serve(opts.copy_path);
}
