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

// Command overlay is a KubeVirt hook sidecar that turns selected disks of a
// VMI into qcow2 overlays over their original source. It serves KubeVirt's
// hook gRPC API on a socket in /var/run/kubevirt-hooks; installed as
// onDefineDomain (or preCloudInitIso) it follows the sidecar-shim
// contract instead. See docs/hooks.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hooks/overlay/sidecar"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
)

// socketsDir is KubeVirt's hooks.HookSocketsSharedDirectory.
const socketsDir = "/var/run/kubevirt-hooks"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "overlay hook:", err)
		os.Exit(1)
	}
}

func run() error {
	log, err := logging.New(logging.Options{})
	if err != nil {
		return err
	}
	container := os.Getenv("CONTAINER_NAME")
	env := sidecar.Environment{
		ContainerName:    container,
		SocketDir:        envOr("OVERLAY_HOOK_SOCKET_DIR", socketsDir),
		ComputeSocketDir: envOr("OVERLAY_HOOK_COMPUTE_SOCKET_DIR", filepath.Join(socketsDir, container)),
	}
	env.PodName, _ = os.Hostname()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer stop()
	ctx = logging.Setup(ctx, log)

	switch filepath.Base(os.Args[0]) {
	case sidecar.ShimOnDefineDomain:
		hook := sidecar.NewHook(env, overlay.Native{}, log)
		return sidecar.RunShimOnDefineDomain(ctx, hook, os.Args[1:], os.Stdout)
	case sidecar.ShimPreCloudInitIso:
		return sidecar.RunShimPreCloudInitIso(os.Args[1:], os.Stdout)
	}

	fs := flag.NewFlagSet("overlay", flag.ContinueOnError)
	fs.StringVar(&env.SocketDir, "socket-dir", env.SocketDir, "directory for the hook socket, shared with the compute container")
	fs.StringVar(&env.ComputeSocketDir, "compute-socket-dir", env.ComputeSocketDir, "the compute container's view of --socket-dir")
	fs.StringVar(&env.ContainerName, "container-name", env.ContainerName, "this sidecar's container name, hook-sidecar-<index>")
	socketName := fs.String("socket-name", "overlay.sock", "socket file name in --socket-dir")
	versions := fs.String("version", strings.Join(sidecar.Versions, ","), "hook API versions to announce, comma-separated")
	points := fs.String("hook-points", "OnDefineDomain,Shutdown", "hook points to subscribe to, comma-separated, from "+strings.Join(sidecar.HookPoints, ","))
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	hook := sidecar.NewHook(env, overlay.Native{}, log)
	server, err := sidecar.NewServer(hook, sidecar.ServerConfig{Versions: split(*versions), HookPoints: split(*points)})
	if err != nil {
		return err
	}
	socket := filepath.Join(env.SocketDir, *socketName)
	log.Info("serving KubeVirt hook", "socket", socket, "versions", *versions, "hookPoints", *points)
	return server.Serve(ctx, socket)
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func split(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
