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

package csiloop_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop/csilooptest"
)

func TestCSILoop(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "csiloop Suite")
}

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// fakes is a driver on fake loop devices and mounts, over its real socket.
type fakes struct {
	*csilooptest.Driver
	loops   *csilooptest.FakeLoops
	mounter *csilooptest.FakeMounter
	state   string
}

func startFakes(socket, state string, loops *csilooptest.FakeLoops, mounter *csilooptest.FakeMounter) *fakes {
	return startNodeFakes("node-a", socket, state, loops, mounter)
}

// startNodeFakes is startFakes for the named node.
func startNodeFakes(node, socket, state string, loops *csilooptest.FakeLoops, mounter *csilooptest.FakeMounter) *fakes {
	d, err := csilooptest.Start(csiloop.Config{
		NodeID: node, StateDir: state, VendorVersion: "test", GrowStagedOnExpand: true,
		Loops: loops, Mounter: mounter, Logger: GinkgoLogr,
	}, socket)
	Expect(err).ToNot(HaveOccurred())
	return &fakes{Driver: d, loops: loops, mounter: mounter, state: state}
}

func newFakes() *fakes {
	dir := GinkgoT().TempDir()
	f := startFakes(filepath.Join(dir, "csi.sock"), filepath.Join(dir, "state"), csilooptest.NewFakeLoops(), csilooptest.NewFakeMounter())
	DeferCleanup(f.Stop)
	return f
}

func code(err error) codes.Code {
	return status.Code(err)
}

func capacity(bytes int64) *csi.CapacityRange {
	return &csi.CapacityRange{RequiredBytes: bytes}
}

func (f *fakes) create(ctx context.Context, name string, bytes int64) *csi.Volume {
	resp, err := f.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, CapacityRange: capacity(bytes), VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
	})
	Expect(err).ToNot(HaveOccurred())
	return resp.GetVolume()
}

func (f *fakes) stage(ctx context.Context, id, staging string) error {
	_, err := f.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: csilooptest.Writer,
	})
	return err
}

func (f *fakes) unstage(ctx context.Context, id, staging string) error {
	_, err := f.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	return err
}

func (f *fakes) publish(ctx context.Context, id, staging, target string) error {
	_, err := f.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csilooptest.Writer,
	})
	return err
}

func (f *fakes) backingFile(id string) string {
	return filepath.Join(f.state, "volumes", id+".img")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	Expect(err).ToNot(HaveOccurred())
	return fi.Size()
}

// The CSI spec's conformance tests, on the fakes; tests/csiloop runs them
// on real loop devices and bind mounts.
var _ = Describe("csi-sanity on fake devices", func() {
	csilooptest.Sanity(func(socket string) *csilooptest.Driver {
		return startFakes(socket, filepath.Join(filepath.Dir(socket), "state"),
			csilooptest.NewFakeLoops(), csilooptest.NewFakeMounter()).Driver
	})
})

var _ = Describe("Identity", func() {
	It("names the driver and offers a controller and online expansion", func(ctx context.Context) {
		f := newFakes()
		info, err := f.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		Expect(err).ToNot(HaveOccurred())
		Expect(info.GetName()).To(Equal("loop.csi.kubevirt-qcow2.io"))
		Expect(info.GetVendorVersion()).To(Equal("test"))

		caps, err := f.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		Expect(err).ToNot(HaveOccurred())
		Expect(caps.GetCapabilities()).To(HaveLen(2))
		Expect(caps.GetCapabilities()[0].GetService().GetType()).To(Equal(csi.PluginCapability_Service_CONTROLLER_SERVICE))
		Expect(caps.GetCapabilities()[1].GetVolumeExpansion().GetType()).To(Equal(csi.PluginCapability_VolumeExpansion_ONLINE))

		probe, err := f.Probe(ctx, &csi.ProbeRequest{})
		Expect(err).ToNot(HaveOccurred())
		Expect(probe.GetReady().GetValue()).To(BeTrue())
	})

	It("is not ready without its state directory", func(ctx context.Context) {
		f := newFakes()
		Expect(os.RemoveAll(f.state)).To(Succeed())
		_, err := f.Probe(ctx, &csi.ProbeRequest{})
		Expect(code(err)).To(Equal(codes.FailedPrecondition))
	})

	It("needs a node ID and a state directory", func() {
		_, err := csiloop.New(csiloop.Config{StateDir: GinkgoT().TempDir()})
		Expect(err).To(MatchError(ContainSubstring("node ID")))
		_, err = csiloop.New(csiloop.Config{NodeID: "n"})
		Expect(err).To(MatchError(ContainSubstring("state directory")))
	})
})

var _ = Describe("CreateVolume", func() {
	var f *fakes
	BeforeEach(func() { f = newFakes() })

	It("makes a sparse file of the requested size, named by the volume's name", func(ctx context.Context) {
		vol := f.create(ctx, "pvc-0d6f", 64*mib)
		Expect(vol.GetVolumeId()).To(Equal("pvc-0d6f"))
		Expect(vol.GetCapacityBytes()).To(Equal(64 * mib))
		Expect(fileSize(f.backingFile("pvc-0d6f"))).To(Equal(64 * mib))
	})

	It("rounds sizes up to 4 KiB, defaults to 1 GiB and keeps within the limit", func(ctx context.Context) {
		Expect(f.create(ctx, "odd", 5000).GetCapacityBytes()).To(Equal(int64(8192)))
		Expect(f.create(ctx, "default", 0).GetCapacityBytes()).To(Equal(gib))
		resp, err := f.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "limited", CapacityRange: &csi.CapacityRange{LimitBytes: 10000},
			VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetVolume().GetCapacityBytes()).To(Equal(int64(8192)))
		_, err = f.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "nothing-fits", CapacityRange: &csi.CapacityRange{RequiredBytes: 5000, LimitBytes: 6000},
			VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(code(err)).To(Equal(codes.OutOfRange))
	})

	It("returns the same volume again and refuses a size outside the new request", func(ctx context.Context) {
		first := f.create(ctx, "pvc-1", 64*mib)
		Expect(f.create(ctx, "pvc-1", 32*mib)).To(Satisfy(func(v *csi.Volume) bool {
			return v.GetVolumeId() == first.GetVolumeId() && v.GetCapacityBytes() == 64*mib
		}), "a smaller request is answered by the volume made")
		_, err := f.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "pvc-1", CapacityRange: capacity(128 * mib), VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(code(err)).To(Equal(codes.AlreadyExists))
	})

	It("keeps a name that is no file name out of paths", func(ctx context.Context) {
		vol := f.create(ctx, "../../etc/passwd", mib)
		Expect(vol.GetVolumeId()).To(HavePrefix("sha256-"))
		Expect(f.backingFile(vol.GetVolumeId())).To(BeARegularFile())
		Expect(f.create(ctx, "../../etc/passwd", mib).GetVolumeId()).To(Equal(vol.GetVolumeId()))
	})

	DescribeTable("refuses what it does not serve with INVALID_ARGUMENT",
		func(ctx context.Context, req *csi.CreateVolumeRequest, why string) {
			_, err := f.CreateVolume(ctx, req)
			Expect(code(err)).To(Equal(codes.InvalidArgument), "%v", err)
			Expect(err).To(MatchError(ContainSubstring(why)))
		},
		Entry("no name", &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer}}, "name"),
		Entry("no capabilities", &csi.CreateVolumeRequest{Name: "v"}, "capabilities"),
		Entry("a Filesystem volume", &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}}, "Filesystem"),
		Entry("an unknown access mode", &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{
			csilooptest.Block(csi.VolumeCapability_AccessMode_UNKNOWN),
		}}, "access mode UNKNOWN is not served"),
		Entry("a StorageClass parameter", &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
			Parameters: map[string]string{"fsType": "ext4"}}, "fsType"),
		Entry("a clone", &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "other"}}}}, "other volumes"),
		Entry("a limit below the required bytes", &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * mib, LimitBytes: mib}}, "exceed"),
	)

	It("reuses a file a crash left without its record", func(ctx context.Context) {
		Expect(os.MkdirAll(filepath.Join(f.state, "volumes"), 0o700)).To(Succeed())
		Expect(os.WriteFile(f.backingFile("pvc-left"), []byte("old data"), 0o600)).To(Succeed())
		Expect(f.create(ctx, "pvc-left", mib).GetCapacityBytes()).To(Equal(mib))
		data, err := os.ReadFile(f.backingFile("pvc-left"))
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Trim(string(data), "\x00")).To(BeEmpty(), "the volume starts zeroed")
	})
})

var _ = Describe("DeleteVolume", func() {
	It("removes the file and is done again for a volume that is gone", func(ctx context.Context) {
		f := newFakes()
		vol := f.create(ctx, "pvc-del", mib)
		for range 2 {
			_, err := f.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
			Expect(err).ToNot(HaveOccurred())
		}
		Expect(f.backingFile(vol.GetVolumeId())).ToNot(BeAnExistingFile())
		_, err := f.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "../state"})
		Expect(err).ToNot(HaveOccurred(), "an ID of no volume")
		_, err = f.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
		Expect(code(err)).To(Equal(codes.InvalidArgument))
	})

	It("refuses a volume that is staged", func(ctx context.Context) {
		f := newFakes()
		vol := f.create(ctx, "pvc-busy", mib)
		Expect(f.stage(ctx, vol.GetVolumeId(), "/staging")).To(Succeed())
		_, err := f.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
		Expect(code(err)).To(Equal(codes.FailedPrecondition))
		Expect(f.unstage(ctx, vol.GetVolumeId(), "/staging")).To(Succeed())
		_, err = f.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
		Expect(err).ToNot(HaveOccurred())
	})
})

var _ = Describe("ValidateVolumeCapabilities", func() {
	It("confirms Block on one node or several, in a known access mode", func(ctx context.Context) {
		f := newFakes()
		vol := f.create(ctx, "pvc-v", mib)
		resp, err := f.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: vol.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetConfirmed().GetVolumeCapabilities()).To(HaveLen(1))

		resp, err = f.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: vol.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{
				csilooptest.Block(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY),
				csilooptest.Block(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
			},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetConfirmed().GetVolumeCapabilities()).To(HaveLen(2))

		resp, err = f.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: vol.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{
				csilooptest.Block(csi.VolumeCapability_AccessMode_UNKNOWN),
			},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetConfirmed()).To(BeNil())
		Expect(resp.GetMessage()).To(ContainSubstring("not served"))

		_, err = f.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: "pvc-none", VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(code(err)).To(Equal(codes.NotFound))
	})
})

var _ = Describe("Expansion", func() {
	var (
		f   *fakes
		vol *csi.Volume
	)
	BeforeEach(func(ctx context.Context) {
		f = newFakes()
		vol = f.create(ctx, "pvc-grow", 16*mib)
	})

	expand := func(ctx context.Context, bytes int64) (*csi.ControllerExpandVolumeResponse, error) {
		return f.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), CapacityRange: capacity(bytes), VolumeCapability: csilooptest.Writer,
		})
	}

	It("grows the file, never shrinks it, and asks for node expansion", func(ctx context.Context) {
		resp, err := expand(ctx, 48*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetCapacityBytes()).To(Equal(48 * mib))
		Expect(resp.GetNodeExpansionRequired()).To(BeTrue())
		Expect(fileSize(f.backingFile(vol.GetVolumeId()))).To(Equal(48 * mib))

		resp, err = expand(ctx, 32*mib)
		Expect(err).ToNot(HaveOccurred(), "a repeated or smaller request")
		Expect(resp.GetCapacityBytes()).To(Equal(48 * mib))

		_, err = f.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib, LimitBytes: 32 * mib},
		})
		Expect(code(err)).To(Equal(codes.OutOfRange), "a limit below the size it has")
	})

	It("refuses unknown volumes and missing fields", func(ctx context.Context) {
		_, err := f.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-none", CapacityRange: capacity(mib)})
		Expect(code(err)).To(Equal(codes.NotFound))
		_, err = f.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol.GetVolumeId()})
		Expect(code(err)).To(Equal(codes.InvalidArgument))
		_, err = f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "pvc-none", VolumePath: "/p"})
		Expect(code(err)).To(Equal(codes.NotFound))
		_, err = f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol.GetVolumeId()})
		Expect(code(err)).To(Equal(codes.InvalidArgument))
	})

	It("grows the staged device in the controller already, and again on the node", func(ctx context.Context) {
		Expect(f.stage(ctx, vol.GetVolumeId(), "/staging")).To(Succeed())
		devs, err := f.loops.Find(f.backingFile(vol.GetVolumeId()))
		Expect(err).ToNot(HaveOccurred())
		Expect(devs).To(HaveLen(1))
		dev := devs[0]
		Expect(f.loops.Capacity(dev)).To(Equal(16 * mib))

		_, err = expand(ctx, 64*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(f.loops.Capacity(dev)).To(Equal(64*mib), "GrowStagedOnExpand")

		resp, err := f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), VolumePath: "/publish/pod", CapacityRange: capacity(64 * mib),
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetCapacityBytes()).To(Equal(64 * mib))
	})

	It("on the node, waits for the controller to grow the file", func(ctx context.Context) {
		Expect(f.stage(ctx, vol.GetVolumeId(), "/staging")).To(Succeed())
		_, err := f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), VolumePath: "/publish/pod", CapacityRange: capacity(64 * mib),
		})
		Expect(code(err)).To(Equal(codes.Internal), "retried by kubelet")
	})

	It("needs nothing on the node for a volume that is not staged", func(ctx context.Context) {
		_, err := expand(ctx, 32*mib)
		Expect(err).ToNot(HaveOccurred())
		resp, err := f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), VolumePath: "/publish/pod", CapacityRange: capacity(32 * mib),
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetCapacityBytes()).To(Equal(32 * mib))
	})
})

var _ = Describe("Staging and publishing", func() {
	var (
		f                *fakes
		id, dir, staging string
	)
	BeforeEach(func(ctx context.Context) {
		f = newFakes()
		id = f.create(ctx, "pvc-node", 8*mib).GetVolumeId()
		dir = GinkgoT().TempDir()
		staging = filepath.Join(dir, "staging")
	})

	It("stages once, publishes onto a file it makes, and undoes both, each call repeatable", func(ctx context.Context) {
		for range 3 {
			Expect(f.stage(ctx, id, staging)).To(Succeed())
		}
		Expect(f.loops.Bound()).To(HaveLen(1))
		target := filepath.Join(dir, "publish", "pod-uid")
		for range 3 {
			Expect(f.publish(ctx, id, staging, target)).To(Succeed())
		}
		Expect(target).To(BeARegularFile())
		Expect(f.mounter.Mounts()).To(HaveKeyWithValue(target, "/dev/fakeloop0"))

		for range 3 {
			_, err := f.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			Expect(err).ToNot(HaveOccurred())
		}
		Expect(target).ToNot(BeAnExistingFile())
		Expect(f.mounter.Mounts()).To(BeEmpty())
		for range 3 {
			Expect(f.unstage(ctx, id, staging)).To(Succeed())
		}
		Expect(f.loops.Bound()).To(BeEmpty())
	})

	It("publishes only staged volumes, and refuses another device at the target", func(ctx context.Context) {
		target := filepath.Join(dir, "pod")
		Expect(code(f.publish(ctx, id, staging, target))).To(Equal(codes.FailedPrecondition))
		Expect(code(f.publish(ctx, "pvc-none", staging, target))).To(Equal(codes.NotFound))
		Expect(code(f.publish(ctx, id, "", target))).To(Equal(codes.InvalidArgument))
		Expect(target).ToNot(BeAnExistingFile())

		Expect(f.stage(ctx, id, staging)).To(Succeed())
		Expect(os.Mkdir(target, 0o700)).To(Succeed())
		Expect(code(f.publish(ctx, id, staging, target))).To(Equal(codes.InvalidArgument), "a directory")
	})

	It("refuses staging an unknown volume, or one read-only that is staged writable", func(ctx context.Context) {
		Expect(code(f.stage(ctx, "pvc-none", staging))).To(Equal(codes.NotFound))
		Expect(code(f.stage(ctx, id, ""))).To(Equal(codes.InvalidArgument))
		_, err := f.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		Expect(code(err)).To(Equal(codes.InvalidArgument), "no capability")
		Expect(f.stage(ctx, id, staging)).To(Succeed())
		_, err = f.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: csilooptest.Block(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY),
		})
		Expect(code(err)).To(Equal(codes.AlreadyExists))
	})

	It("finds its device again after a restart, and unstages it", func(ctx context.Context) {
		Expect(f.stage(ctx, id, staging)).To(Succeed())
		Expect(f.Stop()).To(Succeed())

		// The new process: same state directory, same kernel (the fakes).
		again := startFakes(filepath.Join(dir, "again.sock"), f.state, f.loops, f.mounter)
		DeferCleanup(again.Stop)
		Expect(again.stage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(HaveLen(1), "staged on the same device")
		Expect(again.publish(ctx, id, staging, filepath.Join(dir, "pod"))).To(Succeed())
		_, err := again.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(dir, "pod")})
		Expect(err).ToNot(HaveOccurred())
		Expect(again.unstage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(BeEmpty())
	})

	It("adopts a device a crash left unrecorded instead of attaching a second", func(ctx context.Context) {
		dev, err := f.loops.Attach(f.backingFile(id), false)
		Expect(err).ToNot(HaveOccurred())
		Expect(f.stage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(Equal(map[string]string{dev: f.backingFile(id)}))
		Expect(f.unstage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(BeEmpty())
	})

	It("neither adopts nor detaches the device another node staged the volume on", func(ctx context.Context) {
		// node-b's driver: the same state directory and kernel (the fakes).
		b := startNodeFakes("node-b", filepath.Join(dir, "b.sock"), f.state, f.loops, f.mounter)
		DeferCleanup(b.Stop)
		Expect(b.stage(ctx, id, staging)).To(Succeed())
		theirs := f.loops.Bound()
		Expect(theirs).To(HaveLen(1))

		Expect(f.stage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(HaveLen(2), "a device of node-a's own")
		Expect(f.unstage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(Equal(theirs), "node-b's device stays")
		Expect(b.unstage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(BeEmpty())
	})

	It("never detaches a device that is not the volume's", func(ctx context.Context) {
		Expect(f.stage(ctx, id, staging)).To(Succeed())
		devs, err := f.loops.Find(f.backingFile(id))
		Expect(err).ToNot(HaveOccurred())
		Expect(devs).To(HaveLen(1))
		ours := devs[0]

		By("detaching the volume's device behind the driver's back and binding another file")
		Expect(f.loops.Detach(ours)).To(Succeed())
		other := filepath.Join(dir, "other.img")
		Expect(os.WriteFile(other, nil, 0o600)).To(Succeed())
		foreign, err := f.loops.Attach(other, false)
		Expect(err).ToNot(HaveOccurred())
		rec := filepath.Join(f.state, "staged", "node-a", id+".json")
		Expect(os.WriteFile(rec, []byte(`{"device":"`+foreign+`"}`), 0o600)).To(Succeed())

		Expect(code(f.publish(ctx, id, staging, filepath.Join(dir, "pod")))).To(Equal(codes.FailedPrecondition))
		Expect(f.unstage(ctx, id, staging)).To(Succeed())
		Expect(f.loops.Bound()).To(HaveKeyWithValue(foreign, other))
		Expect(rec).ToNot(BeAnExistingFile())

		By("staging again on a device of its own")
		Expect(f.stage(ctx, id, staging)).To(Succeed())
		data, err := os.ReadFile(rec)
		Expect(err).ToNot(HaveOccurred())
		var staged struct{ Device string }
		Expect(json.Unmarshal(data, &staged)).To(Succeed())
		Expect(staged.Device).ToNot(Equal(foreign))
		Expect(f.loops.Bound()).To(HaveKeyWithValue(staged.Device, f.backingFile(id)))
	})

	It("reports its node", func(ctx context.Context) {
		info, err := f.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		Expect(err).ToNot(HaveOccurred())
		Expect(info.GetNodeId()).To(Equal("node-a"))
		caps, err := f.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		Expect(err).ToNot(HaveOccurred())
		var types []csi.NodeServiceCapability_RPC_Type
		for _, c := range caps.GetCapabilities() {
			types = append(types, c.GetRpc().GetType())
		}
		Expect(types).To(ConsistOf(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, csi.NodeServiceCapability_RPC_EXPAND_VOLUME))
	})
})

var _ = Describe("Kubelet plugin registration", func() {
	It("tells kubelet a CSI plugin's name, endpoint and version, and hears the outcome", func(ctx context.Context) {
		sock := filepath.Join(GinkgoT().TempDir(), "reg.sock")
		failed := make(chan error, 1)
		reg := &csiloop.Registration{Name: csiloop.DefaultDriverName, Endpoint: "/var/lib/kubelet/plugins/x/csi.sock",
			Failed: func(err error) { failed <- err }}
		l, err := csiloop.Listen(sock)
		Expect(err).ToNot(HaveOccurred())
		serveCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- csiloop.Serve(serveCtx, reg.NewServer(), l) }()
		DeferCleanup(func() {
			stop()
			Expect(<-done).To(Succeed())
			Expect(sock).ToNot(BeAnExistingFile(), "kubelet sees a stopped plugin go")
		})

		// As kubelet's plugin watcher calls it.
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(conn.Close)
		client := registerapi.NewRegistrationClient(conn)
		info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
		Expect(err).ToNot(HaveOccurred())
		Expect(info.GetType()).To(Equal(registerapi.CSIPlugin))
		Expect(info.GetName()).To(Equal("loop.csi.kubevirt-qcow2.io"))
		Expect(info.GetEndpoint()).To(Equal("/var/lib/kubelet/plugins/x/csi.sock"))
		Expect(info.GetSupportedVersions()).To(Equal([]string{"1.0.0"}))

		_, err = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
		Expect(err).ToNot(HaveOccurred())
		Expect(failed).ToNot(Receive())
		_, err = client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "no such driver version"})
		Expect(err).ToNot(HaveOccurred())
		Expect(failed).To(Receive(MatchError(ContainSubstring("no such driver version"))))
	})
})
