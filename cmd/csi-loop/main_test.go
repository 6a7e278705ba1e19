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

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// As kubelet meets the driver: the registration socket names the CSI
// socket, which answers NodeGetInfo; SIGTERM (a cancelled context) stops
// both and removes the sockets; a refused registration stops the driver
// with an error, for the pod to restart.
func TestRunServesKubeletAndStops(t *testing.T) {
	dir := t.TempDir()
	o := options{
		name: "loop.csi.kubevirt-qcow2.io", endpoint: filepath.Join(dir, "plugins", "csi.sock"),
		registration: filepath.Join(dir, "plugins_registry", "reg.sock"), stateDir: filepath.Join(dir, "state"), nodeID: "node-a",
	}
	log := testr.New(t)

	for _, refused := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, log, o) }()

		reg := registerapi.NewRegistrationClient(dial(t, o.registration))
		var info *registerapi.PluginInfo
		var err error
		for range 100 { // until it listens
			if info, err = reg.GetInfo(ctx, &registerapi.InfoRequest{}); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("GetInfo: %v", err)
		}
		if info.GetType() != registerapi.CSIPlugin || info.GetName() != o.name || info.GetEndpoint() != o.endpoint {
			t.Fatalf("GetInfo = %v", info)
		}
		node, err := csi.NewNodeClient(dial(t, info.GetEndpoint())).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		if err != nil || node.GetNodeId() != "node-a" {
			t.Fatalf("NodeGetInfo = %v, %v", node, err)
		}

		if refused {
			if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "refused"}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err == nil || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("run after a refused registration = %v", err)
			}
		} else {
			if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("run after SIGTERM = %v", err)
			}
		}
		cancel()
		for _, sock := range []string{o.endpoint, o.registration} {
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("%s left behind: %v", sock, err)
			}
		}
	}
}

func TestRunNeedsANodeID(t *testing.T) {
	err := run(context.Background(), logr.Discard(), options{endpoint: filepath.Join(t.TempDir(), "csi.sock")})
	if err == nil || !strings.Contains(err.Error(), "-node-id") {
		t.Fatalf("run without a node ID = %v", err)
	}
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
