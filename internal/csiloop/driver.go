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

// Package csiloop is a CSI driver for the nodes of one machine whose
// volumes are sparse files under a state directory, staged as loop
// devices: Block volumes that the real external-provisioner creates and
// deletes, the real external-resizer grows while in use, and kubelet
// stages, publishes and expands on the nodes. It serves the CSI Identity,
// Controller and Node services on one socket, and kubelet's plugin
// registration API on another (registration.go), so that no
// node-driver-registrar is needed.
//
// The drivers of several nodes may share the state directory, and then
// serve ReadWriteMany and ReadOnlyMany volumes: the nodes must be one
// machine's (one kernel), as the test cluster's are, so that each node's
// loop device of a volume reads and writes the same file through the same
// page cache, and one driver can grow them all.
//
// It exists so that the end-to-end tests grow thin volumes through the
// same sidecars production clusters run; it is not a storage product: one
// machine, no topology, snapshots or clones, no Filesystem volumes.
package csiloop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultDriverName is the CSI driver's name, the CSIDriver object's and
// the StorageClass's provisioner.
const DefaultDriverName = "loop.csi.kubevirt-qcow2.io"

// DefaultVolumeSize is the size of a volume whose request names none.
const DefaultVolumeSize = int64(1) << 30

// sizeAlignment is what volume sizes are rounded up to: a loop device
// ignores a partial last sector, and 4 KiB suits every sector size.
const sizeAlignment = 4096

// Config configures a Driver.
type Config struct {
	// Name is the driver's name; DefaultDriverName when empty.
	Name string
	// VendorVersion is reported by GetPluginInfo.
	VendorVersion string
	// NodeID is the node's ID, its Kubernetes name. Required.
	NodeID string
	// StateDir holds the volumes and what the driver knows of them.
	// Required; it must outlive the driver's process (a hostPath), and
	// be the same directory on every node that is to share volumes.
	StateDir string
	// GrowStagedOnExpand makes ControllerExpandVolume also refresh the
	// loop devices of a staged volume, on every node of the machine, so
	// that they grow as soon as the resizer asks rather than at each
	// kubelet's next sync of the pod. NodeExpandVolume stays required and
	// does the same on its node.
	GrowStagedOnExpand bool
	// Loops and Mounter are the kernel's when nil.
	Loops   Loops
	Mounter Mounter
	// Logger logs every call; the zero value discards.
	Logger logr.Logger
}

// Driver serves the CSI services. Every call that changes state holds one
// lock, shared with the drivers of the other nodes: calls are few and
// quick, and none may interleave with another on the same volume.
type Driver struct {
	name, version, nodeID string
	growStaged            bool
	state                 *state
	loops                 Loops
	mounter               Mounter
	log                   logr.Logger
	mu                    sync.Mutex
}

// New makes a Driver, creating its state directory.
func New(cfg Config) (*Driver, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("csiloop: a node ID is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("csiloop: a state directory is required")
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("csiloop: %w", err)
	}
	st, err := newState(dir, cfg.NodeID)
	if err != nil {
		return nil, fmt.Errorf("csiloop: %w", err)
	}
	d := &Driver{
		name: cfg.Name, version: cfg.VendorVersion, nodeID: cfg.NodeID, growStaged: cfg.GrowStagedOnExpand,
		state: st, loops: cfg.Loops, mounter: cfg.Mounter, log: cfg.Logger,
	}
	if d.name == "" {
		d.name = DefaultDriverName
	}
	if d.loops == nil {
		d.loops = kernelLoops{}
	}
	if d.mounter == nil {
		d.mounter = kernelMounter{}
	}
	return d, nil
}

// lock serializes the calls that change state, within this driver and
// with the drivers of other nodes sharing the state directory, and
// returns the release.
func (d *Driver) lock() (func(), error) {
	d.mu.Lock()
	unlock, err := d.state.lock()
	if err != nil {
		d.mu.Unlock()
		return nil, internal(err)
	}
	return func() {
		unlock()
		d.mu.Unlock()
	}, nil
}

// Name is the driver's name.
func (d *Driver) Name() string { return d.name }

// NewServer returns a gRPC server of the driver's Identity, Controller and
// Node services that logs every call.
func (d *Driver) NewServer() *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCall))
	csi.RegisterIdentityServer(srv, &identityServer{d: d})
	csi.RegisterControllerServer(srv, &controllerServer{d: d})
	csi.RegisterNodeServer(srv, &nodeServer{d: d})
	return srv
}

// polled are the calls the sidecars and kubelet make to learn what the
// driver is and can do: logged at debug level only.
var polled = map[string]bool{
	"/csi.v1.Identity/GetPluginInfo":               true,
	"/csi.v1.Identity/GetPluginCapabilities":       true,
	"/csi.v1.Identity/Probe":                       true,
	"/csi.v1.Controller/ControllerGetCapabilities": true,
	"/csi.v1.Node/NodeGetCapabilities":             true,
	"/csi.v1.Node/NodeGetInfo":                     true,
}

// volumeIDGetter is every request that names a volume.
type volumeIDGetter interface{ GetVolumeId() string }

func (d *Driver) logCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	attrs := []any{"method", info.FullMethod, "duration", time.Since(start).Round(time.Microsecond)}
	if r, ok := req.(volumeIDGetter); ok {
		attrs = append(attrs, "volume", r.GetVolumeId())
	}
	switch {
	case err != nil:
		d.log.Error(err, "call failed", append(attrs, "code", status.Code(err))...)
	case polled[info.FullMethod]:
		d.log.V(1).Info("call", attrs...)
	default:
		d.log.Info("call", attrs...)
	}
	return resp, err
}

// Listen listens on the unix socket at path, replacing a socket a previous
// process left there.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// Serve serves srv on l until ctx is done, then stops it gracefully and
// removes the socket, so that kubelet sees a stopped plugin go.
func Serve(ctx context.Context, srv *grpc.Server, l net.Listener) error {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.GracefulStop()
		case <-done:
		}
	}()
	err := srv.Serve(l)
	close(done)
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("serve on %s: %w", l.Addr(), err)
	}
	return nil
}

// invalid, notFound, ... are the gRPC status errors the CSI spec names.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func notFound(id string) error {
	return status.Errorf(codes.NotFound, "no volume %q", id)
}

func internal(err error) error {
	return status.Error(codes.Internal, err.Error())
}

// exists is nil when volume id exists, else NOT_FOUND (or INTERNAL when
// its record cannot be read).
func (d *Driver) exists(id string) error {
	rec, err := d.state.volume(id)
	if err != nil {
		return internal(err)
	}
	if rec == nil {
		return notFound(id)
	}
	return nil
}

// size is the size of volume id, with exists's errors.
func (d *Driver) size(id string) (int64, error) {
	if err := d.exists(id); err != nil {
		return 0, err
	}
	size, err := d.state.size(id)
	if err != nil {
		return 0, internal(err)
	}
	return size, nil
}

// checkCapability refuses what the driver does not serve: anything but a
// Block volume. Several nodes may have it only when their drivers share
// the state directory; one that does not has no such volume to stage.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return errors.New("a volume capability is required")
	}
	if c.GetBlock() == nil {
		if c.GetMount() != nil {
			return errors.New("volumes of access type Filesystem are not served, only Block")
		}
		return errors.New("the volume capability has no access type")
	}
	switch mode := c.GetAccessMode().GetMode(); mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		return nil
	default:
		return fmt.Errorf("access mode %s is not served", mode)
	}
}

func checkCapabilities(cs []*csi.VolumeCapability) error {
	if len(cs) == 0 {
		return errors.New("volume capabilities are required")
	}
	for _, c := range cs {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// readOnlyMode reports whether an access mode allows no writes.
func readOnlyMode(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return true
	}
	return false
}
