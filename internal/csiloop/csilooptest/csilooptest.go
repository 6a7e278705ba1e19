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

// Package csilooptest runs a csiloop driver on a unix socket with clients
// of its services, as the sidecars and kubelet reach it; runs csi-sanity,
// the CSI spec's own conformance tests, against it; and has fakes of its
// loop devices and mounts for the unit tests, which run without root. The
// functional suite (tests/csiloop) runs the same with the kernel's.
package csilooptest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop"
)

// Driver is a running driver and a connection to it.
type Driver struct {
	*csiloop.Driver
	// Socket is the path of the CSI socket.
	Socket string
	// Conn is a client connection to Socket.
	Conn *grpc.ClientConn
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient

	stop     context.CancelFunc
	done     chan error
	stopOnce sync.Once
	stopErr  error
}

// Start serves a driver made from cfg on socket and connects to it.
func Start(cfg csiloop.Config, socket string) (*Driver, error) {
	d, err := csiloop.New(cfg)
	if err != nil {
		return nil, err
	}
	l, err := csiloop.Listen(socket)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- csiloop.Serve(ctx, d.NewServer(), l) }()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		stop()
		return nil, errors.Join(fmt.Errorf("connect to %s: %w", socket, err), <-done)
	}
	return &Driver{
		Driver: d, Socket: socket, Conn: conn,
		IdentityClient: csi.NewIdentityClient(conn), ControllerClient: csi.NewControllerClient(conn), NodeClient: csi.NewNodeClient(conn),
		stop: stop, done: done,
	}, nil
}

// Stop closes the connection and stops the driver, as a killed pod would
// be: what it knows stays in its state directory. Again, it does nothing.
func (d *Driver) Stop() error {
	d.stopOnce.Do(func() {
		err := d.Conn.Close()
		d.stop()
		d.stopErr = errors.Join(err, <-d.done)
	})
	return d.stopErr
}

// Sanity registers csi-sanity's specs, each against a driver start makes
// (in a BeforeEach) with the socket and a directory for the specs' target
// and staging paths, all under a temporary directory of the spec. Call it
// where Ginkgo containers are built.
func Sanity(start func(socket string) *Driver) {
	cfg := sanity.NewTestConfig()
	var sc *sanity.TestContext
	ginkgo.BeforeEach(func() {
		if strings.Contains(ginkgo.CurrentSpecReport().FullText(), refusedSpec) {
			ginkgo.Skip("csi-sanity makes this spec's volume with a Filesystem capability, which a Block-only driver refuses " +
				"(INVALID_ARGUMENT, as the spec asks); the driver's own specs cover staging without a capability")
		}
		dir := ginkgo.GinkgoT().TempDir()
		d := start(filepath.Join(dir, "csi.sock"))
		ginkgo.DeferCleanup(d.Stop)
		// The driver's own connection: csi-test's Connect waits for the
		// connection's state to change from what it reads first, and on a
		// local socket that may be Ready already, when it waits a minute
		// in vain. With no address, Setup keeps the connection it finds.
		cfg.Address = ""
		sc.Conn, sc.ControllerConn = d.Conn, d.Conn
		cfg.TargetPath = filepath.Join(dir, "target")
		cfg.StagingPath = filepath.Join(dir, "staging")
		cfg.TestVolumeAccessType = "block"
		// Sparse files: csi-sanity's 10 GiB volumes take no space.
	})
	sc = sanity.GinkgoTest(&cfg)
}

// refusedSpec is the csi-sanity spec that assumes Filesystem volumes.
const refusedSpec = "NodeStageVolume should fail when no volume capability is provided"

// Block is a capability of a Block volume on one node.
func Block(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// Writer is Block(SINGLE_NODE_WRITER), what ReadWriteOnce claims ask for.
var Writer = Block(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

// FakeLoops are loop devices in a map: a device is bound to a file by
// path, and backs the file while that path names the same inode.
type FakeLoops struct {
	mu       sync.Mutex
	next     int
	bound    map[string]string
	capacity map[string]int64
}

var _ csiloop.Loops = &FakeLoops{}

// NewFakeLoops makes FakeLoops with no device bound.
func NewFakeLoops() *FakeLoops {
	return &FakeLoops{bound: map[string]string{}, capacity: map[string]int64{}}
}

// Attach binds file to the next device.
func (f *FakeLoops) Attach(file string, _ bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	dev := fmt.Sprintf("/dev/fakeloop%d", f.next)
	f.next++
	f.bound[dev] = file
	f.capacity[dev] = fi.Size()
	return dev, nil
}

// Detach unbinds dev.
func (f *FakeLoops) Detach(dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.bound, dev)
	delete(f.capacity, dev)
	return nil
}

// Backs reports whether dev is bound to file's inode.
func (f *FakeLoops) Backs(dev, file string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.backs(dev, file), nil
}

func (f *FakeLoops) backs(dev, file string) bool {
	bound, ok := f.bound[dev]
	if !ok {
		return false
	}
	a, errA := os.Stat(bound)
	b, errB := os.Stat(file)
	return errA == nil && errB == nil && os.SameFile(a, b)
}

// Find returns the devices bound to file.
func (f *FakeLoops) Find(file string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var devs []string
	for _, dev := range f.devices() {
		if f.backs(dev, file) {
			devs = append(devs, dev)
		}
	}
	return devs, nil
}

// RefreshCapacity takes the bound file's size.
func (f *FakeLoops) RefreshCapacity(dev string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	file, ok := f.bound[dev]
	if !ok {
		return 0, fmt.Errorf("%s is not bound", dev)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	f.capacity[dev] = fi.Size()
	return fi.Size(), nil
}

// Bound is every bound device and its file.
func (f *FakeLoops) Bound() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.bound)
}

// Capacity is the size dev took when bound or last refreshed.
func (f *FakeLoops) Capacity(dev string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capacity[dev]
}

func (f *FakeLoops) devices() []string {
	devs := make([]string, 0, len(f.bound))
	for dev := range f.bound {
		devs = append(devs, dev)
	}
	sort.Strings(devs)
	return devs
}

// FakeMounter keeps mounts in a map; a device is bound only onto a file
// that exists, as mount(2) requires.
type FakeMounter struct {
	mu     sync.Mutex
	mounts map[string]string
}

var _ csiloop.Mounter = &FakeMounter{}

// NewFakeMounter makes a FakeMounter with nothing mounted.
func NewFakeMounter() *FakeMounter {
	return &FakeMounter{mounts: map[string]string{}}
}

// BindDevice mounts dev on target.
func (m *FakeMounter) BindDevice(dev, target string, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	fi, err := os.Stat(target)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a file", target)
	}
	m.mounts[target] = dev
	return nil
}

// IsMountOf reports whether dev is mounted on target.
func (m *FakeMounter) IsMountOf(dev, target string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mounts[target] == dev, nil
}

// Unmount unmounts target.
func (m *FakeMounter) Unmount(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.mounts, target)
	return nil
}

// Mounts is every mount: target to device.
func (m *FakeMounter) Mounts() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.mounts)
}
