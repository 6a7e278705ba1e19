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

// Command csi-loop is a CSI driver for one node whose Block volumes are
// sparse files on loop devices (package internal/csiloop), registered with
// kubelet by itself. It runs beside the external-provisioner and the
// external-resizer sidecars (deploy/csi-loop), as root: it attaches loop
// devices and makes bind mounts.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
)

// version is set at link time by the image build.
var version = "dev"

func main() {
	name := flag.String("driver-name", csiloop.DefaultDriverName, "the CSI driver's name")
	endpoint := flag.String("endpoint", "/var/lib/kubelet/plugins/"+csiloop.DefaultDriverName+"/csi.sock",
		"unix socket to serve the CSI services on")
	kubeletEndpoint := flag.String("kubelet-endpoint", "",
		"the CSI socket's path on the node, as registered with kubelet (default: -endpoint)")
	registration := flag.String("registration-socket", "",
		"unix socket to serve kubelet's plugin registration on, e.g. /var/lib/kubelet/plugins_registry/"+
			csiloop.DefaultDriverName+"-reg.sock (default: none)")
	stateDir := flag.String("state-dir", "/var/lib/csi-loop", "directory of the volumes' files and records, kept across restarts")
	nodeID := flag.String("node-id", os.Getenv("NODE_NAME"), "the node's name (default: $NODE_NAME)")
	growStaged := flag.Bool("grow-staged-on-expand", true,
		"refresh a staged volume's loop device in ControllerExpandVolume already, not only in NodeExpandVolume")
	verbose := flag.Bool("v", false, "log polls too")
	flag.Parse()

	var logOpts logging.Options
	if *verbose {
		logOpts.Verbosity = 1
	}
	log, err := logging.New(logOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "csi-loop:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx = logging.Setup(ctx, log)
	err = run(ctx, log, options{
		name: *name, endpoint: *endpoint, kubeletEndpoint: *kubeletEndpoint, registration: *registration,
		stateDir: *stateDir, nodeID: *nodeID, growStaged: *growStaged,
	})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "csi-loop:", err)
		os.Exit(1)
	}
}

type options struct {
	name, endpoint, kubeletEndpoint, registration, stateDir, nodeID string
	growStaged                                                      bool
}

func run(ctx context.Context, log logr.Logger, o options) error {
	if o.nodeID == "" {
		return errors.New("-node-id (or $NODE_NAME) is required")
	}
	if o.endpoint == "" {
		return errors.New("-endpoint is required")
	}
	d, err := csiloop.New(csiloop.Config{
		Name: o.name, VendorVersion: version, NodeID: o.nodeID, StateDir: o.stateDir,
		GrowStagedOnExpand: o.growStaged, Logger: log,
	})
	if err != nil {
		return err
	}
	endpoint := o.kubeletEndpoint
	if endpoint == "" {
		endpoint = o.endpoint
	}
	if o.registration != "" && !filepath.IsAbs(endpoint) {
		return fmt.Errorf("the endpoint registered with kubelet must be an absolute path, got %q", endpoint)
	}

	// The CSI socket listens first: kubelet calls NodeGetInfo there as
	// soon as it finds the registration socket.
	listeners := map[string]net.Listener{}
	for _, path := range []string{o.endpoint, o.registration} {
		if path == "" {
			continue
		}
		l, err := csiloop.Listen(path)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		listeners[path] = l
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errs := make(chan error, len(listeners))
	go func() { errs <- csiloop.Serve(ctx, d.NewServer(), listeners[o.endpoint]) }()
	if o.registration != "" {
		reg := &csiloop.Registration{Name: d.Name(), Endpoint: endpoint, Logger: log, Failed: cancel}
		go func() { errs <- csiloop.Serve(ctx, reg.NewServer(), listeners[o.registration]) }()
	}
	log.Info("serving", "driver", d.Name(), "version", version, "node", o.nodeID, "endpoint", o.endpoint,
		"registration", o.registration, "state", o.stateDir)

	// Both stop together: the first to end ends the other.
	var first error
	for range listeners {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		cancel(nil)
	}
	if first != nil {
		return first
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}
