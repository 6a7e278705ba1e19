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
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/csiloop/csilooptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// startDriver runs the driver of node-a on the kernel's loop devices and
// mounts, its state under dir; what it attached or mounted under dir must
// be gone when the spec ends.
func startDriver(dir, socket string, growStaged bool) *csilooptest.Driver {
	return startNodeDriver(dir, socket, "node-a", growStaged)
}

// startNodeDriver is startDriver for the named node.
func startNodeDriver(dir, socket, node string, growStaged bool) *csilooptest.Driver {
	d, err := csilooptest.Start(csiloop.Config{
		NodeID: node, StateDir: filepath.Join(dir, "state"), GrowStagedOnExpand: growStaged,
		Logger: GinkgoLogr,
	}, socket)
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(func() {
		// A failed spec leaves what it made: taken away first, so that
		// the machine stays clean, then failed for.
		mounts := mountsUnder(dir)
		for _, m := range mounts {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
		// A device is unbound when the last user closes it: at once,
		// unless the kernel defers it.
		var bound []string
		for range 50 {
			if bound = boundUnder(dir); len(bound) == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, dev := range bound {
			_ = blockdev.DetachLoop("/dev/" + dev)
		}
		Expect(mounts).To(BeEmpty(), "mounts left")
		Expect(bound).To(BeEmpty(), "loop devices left bound")
	})
	return d
}

func mountsUnder(dir string) []string {
	mounts, err := testenv.MountPoints()
	Expect(err).ToNot(HaveOccurred())
	var under []string
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, dir+"/") {
			under = append(under, m.MountPoint)
		}
	}
	return under
}

var _ = Describe("csi-sanity on loop devices and bind mounts", func() {
	csilooptest.Sanity(func(socket string) *csilooptest.Driver {
		return startDriver(filepath.Dir(socket), socket, true)
	})
})

var _ = Describe("A Block volume on a loop device", func() {
	var (
		dir, staging, target string
		d                    *csilooptest.Driver
		id                   string
	)

	start := func(ctx context.Context, growStaged bool) {
		dir = GinkgoT().TempDir()
		staging = filepath.Join(dir, "staging")
		target = filepath.Join(dir, "publish", "pod-uid")
		Expect(os.MkdirAll(staging, 0o750)).To(Succeed())
		d = startDriver(dir, filepath.Join(dir, "csi.sock"), growStaged)
		DeferCleanup(d.Stop)
		resp, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "pvc-e2e", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{csilooptest.Writer},
		})
		Expect(err).ToNot(HaveOccurred())
		id = resp.GetVolume().GetVolumeId()
	}
	backing := func() string { return filepath.Join(dir, "state", "volumes", id+".img") }
	stage := func(ctx context.Context, d *csilooptest.Driver) error {
		_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: csilooptest.Writer})
		return err
	}
	unstage := func(ctx context.Context, d *csilooptest.Driver) error {
		_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		return err
	}
	publish := func(ctx context.Context, d *csilooptest.Driver) error {
		_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csilooptest.Writer,
		})
		return err
	}
	unpublish := func(ctx context.Context, d *csilooptest.Driver) error {
		_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	}
	expand := func(ctx context.Context, bytes int64) {
		resp, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes}, VolumeCapability: csilooptest.Writer,
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetCapacityBytes()).To(Equal(bytes))
		Expect(resp.GetNodeExpansionRequired()).To(BeTrue())
	}
	nodeExpand := func(ctx context.Context, bytes int64) {
		resp, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: bytes},
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(resp.GetCapacityBytes()).To(Equal(bytes))
	}

	It("is published as its loop device, written through it, grown while in use and torn down", func(ctx context.Context) {
		start(ctx, false)
		Expect(stage(ctx, d)).To(Succeed())
		devs, err := blockdev.FindLoops(backing())
		Expect(err).ToNot(HaveOccurred())
		Expect(devs).To(HaveLen(1))
		dev := devs[0]
		Expect(publish(ctx, d)).To(Succeed())
		Expect(publish(ctx, d)).To(Succeed(), "again")
		Expect(mountsUnder(dir)).To(ConsistOf(target), "one mount however often published")

		By("seeing the loop device at the target, and the file behind it")
		var got, want unix.Stat_t
		Expect(unix.Stat(target, &got)).To(Succeed())
		Expect(unix.Stat(dev, &want)).To(Succeed())
		Expect(got.Mode & unix.S_IFMT).To(BeEquivalentTo(unix.S_IFBLK))
		Expect(got.Rdev).To(Equal(want.Rdev))
		pattern := bytes.Repeat([]byte("kubevirt-qcow2 "), 4096/15+1)[:4096]
		f, err := os.OpenFile(target, os.O_WRONLY, 0)
		Expect(err).ToNot(HaveOccurred())
		_, err = f.WriteAt(pattern, 8*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(f.Sync()).To(Succeed())
		Expect(f.Close()).To(Succeed())
		data := make([]byte, len(pattern))
		b, err := os.Open(backing())
		Expect(err).ToNot(HaveOccurred())
		_, err = b.ReadAt(data, 8*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(b.Close()).To(Succeed())
		Expect(data).To(Equal(pattern))

		By("growing it: the controller grows the file, the node the device")
		Expect(sizeOf(target)).To(Equal(16 * mib))
		expand(ctx, 48*mib)
		Expect(sizeOf(backing())).To(Equal(48 * mib))
		Expect(sizeOf(target)).To(Equal(16*mib), "without GrowStagedOnExpand the device waits for the node")
		nodeExpand(ctx, 48*mib)
		Expect(sizeOf(target)).To(Equal(48 * mib))
		nodeExpand(ctx, 48*mib)

		By("tearing it down, each step twice")
		for range 2 {
			Expect(unpublish(ctx, d)).To(Succeed())
		}
		Expect(target).ToNot(BeAnExistingFile())
		Expect(mountsUnder(dir)).To(BeEmpty())
		for range 2 {
			Expect(unstage(ctx, d)).To(Succeed())
		}
		Expect(blockdev.FindLoops(backing())).To(BeEmpty())
		for range 2 {
			_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			Expect(err).ToNot(HaveOccurred())
		}
		Expect(backing()).ToNot(BeAnExistingFile())
	})

	It("grows the device of a staged volume in ControllerExpandVolume already", func(ctx context.Context) {
		start(ctx, true)
		Expect(stage(ctx, d)).To(Succeed())
		Expect(publish(ctx, d)).To(Succeed())
		expand(ctx, 32*mib)
		Expect(sizeOf(target)).To(Equal(32 * mib))
		nodeExpand(ctx, 32*mib)
		Expect(unpublish(ctx, d)).To(Succeed())
		Expect(unstage(ctx, d)).To(Succeed())
	})

	It("refuses to delete a staged volume", func(ctx context.Context) {
		start(ctx, true)
		Expect(stage(ctx, d)).To(Succeed())
		_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
		Expect(unstage(ctx, d)).To(Succeed())
	})

	It("carries on after a restart of the driver with the devices and mounts it made", func(ctx context.Context) {
		start(ctx, true)
		Expect(stage(ctx, d)).To(Succeed())
		Expect(publish(ctx, d)).To(Succeed())
		devs, err := blockdev.FindLoops(backing())
		Expect(err).ToNot(HaveOccurred())
		Expect(d.Stop()).To(Succeed())

		again := startDriver(dir, filepath.Join(dir, "again.sock"), true)
		DeferCleanup(again.Stop)
		Expect(stage(ctx, again)).To(Succeed())
		Expect(publish(ctx, again)).To(Succeed())
		Expect(blockdev.FindLoops(backing())).To(Equal(devs), "the same device")
		Expect(mountsUnder(dir)).To(ConsistOf(target), "the same mount")
		Expect(unpublish(ctx, again)).To(Succeed())
		Expect(unstage(ctx, again)).To(Succeed())
		Expect(blockdev.FindLoops(backing())).To(BeEmpty())
	})

	It("adopts the device a crash left unrecorded, rather than attaching a second", func(ctx context.Context) {
		start(ctx, true)
		dev, err := blockdev.AttachLoop(backing(), false)
		Expect(err).ToNot(HaveOccurred())
		Expect(stage(ctx, d)).To(Succeed())
		Expect(boundUnder(dir)).To(ConsistOf(filepath.Base(dev)))
		Expect(unstage(ctx, d)).To(Succeed())
		Expect(boundUnder(dir)).To(BeEmpty())
	})

	It("never detaches a loop device that is not the volume's", func(ctx context.Context) {
		start(ctx, true)
		Expect(stage(ctx, d)).To(Succeed())
		devs, err := blockdev.FindLoops(backing())
		Expect(err).ToNot(HaveOccurred())
		Expect(devs).To(HaveLen(1))
		ours := devs[0]

		By("detaching the volume's device behind the driver's back; another file takes a device, likely the same")
		Expect(blockdev.DetachLoop(ours)).To(Succeed())
		other := filepath.Join(dir, "other.img")
		Expect(os.WriteFile(other, nil, 0o600)).To(Succeed())
		Expect(os.Truncate(other, mib)).To(Succeed())
		foreign, err := blockdev.AttachLoop(other, false)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(blockdev.DetachLoop, foreign)
		Expect(os.WriteFile(filepath.Join(dir, "state", "staged", "node-a", id+".json"),
			[]byte(`{"device":"`+foreign+`"}`), 0o600)).To(Succeed())

		_, err = d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csilooptest.Writer,
		})
		Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
		Expect(unstage(ctx, d)).To(Succeed())
		Expect(blockdev.LoopBacks(foreign, other)).To(BeTrue(), "still bound to its own file")
	})
})

// Two nodes of one machine whose drivers share the state directory, as the
// test cluster's nodes do: a ReadWriteMany volume is staged on a loop
// device of each, what one writes the other reads, and a growth reaches
// both devices at once.
var _ = Describe("A ReadWriteMany Block volume on two nodes of one machine", func() {
	It("is staged on a device per node, grown on both, and torn down node by node", func(ctx context.Context) {
		dir := GinkgoT().TempDir()
		a := startNodeDriver(dir, filepath.Join(dir, "a.sock"), "node-a", true)
		DeferCleanup(a.Stop)
		b := startNodeDriver(dir, filepath.Join(dir, "b.sock"), "node-b", true)
		DeferCleanup(b.Stop)
		shared := csilooptest.Block(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
		resp, err := a.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "pvc-rwx", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{shared},
		})
		Expect(err).ToNot(HaveOccurred())
		id := resp.GetVolume().GetVolumeId()
		backing := filepath.Join(dir, "state", "volumes", id+".img")
		device := map[*csilooptest.Driver]string{}
		for node, d := range map[string]*csilooptest.Driver{"a": a, "b": b} {
			staging := filepath.Join(dir, node, "staging")
			Expect(os.MkdirAll(staging, 0o750)).To(Succeed())
			for range 2 {
				_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: shared})
				Expect(err).ToNot(HaveOccurred())
			}
			target := filepath.Join(dir, node, "publish")
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
				VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: shared,
			})
			Expect(err).ToNot(HaveOccurred())
			device[d] = target
		}
		Expect(blockdev.FindLoops(backing)).To(HaveLen(2), "a device per node")

		By("reading on one node what the other wrote")
		pattern := bytes.Repeat([]byte("two nodes "), 4096/10+1)[:4096]
		w, err := os.OpenFile(device[a], os.O_WRONLY, 0)
		Expect(err).ToNot(HaveOccurred())
		_, err = w.WriteAt(pattern, 4*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(w.Sync()).To(Succeed())
		Expect(w.Close()).To(Succeed())
		r, err := os.Open(device[b])
		Expect(err).ToNot(HaveOccurred())
		data := make([]byte, len(pattern))
		_, err = r.ReadAt(data, 4*mib)
		Expect(err).ToNot(HaveOccurred())
		Expect(r.Close()).To(Succeed())
		Expect(data).To(Equal(pattern))

		By("growing it through one node's controller: both devices take the size")
		_, err = b.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 40 * mib}, VolumeCapability: shared,
		})
		Expect(err).ToNot(HaveOccurred())
		Expect(sizeOf(device[a])).To(Equal(40 * mib))
		Expect(sizeOf(device[b])).To(Equal(40 * mib))

		By("tearing it down on one node, the other keeping its device")
		_, err = b.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: device[b]})
		Expect(err).ToNot(HaveOccurred())
		_, err = b.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(dir, "b", "staging")})
		Expect(err).ToNot(HaveOccurred())
		Expect(blockdev.FindLoops(backing)).To(HaveLen(1))
		Expect(sizeOf(device[a])).To(Equal(40*mib), "node-a's device still published")
		_, err = b.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		Expect(status.Code(err)).To(Equal(codes.FailedPrecondition), "staged on node-a")

		_, err = a.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: device[a]})
		Expect(err).ToNot(HaveOccurred())
		_, err = a.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(dir, "a", "staging")})
		Expect(err).ToNot(HaveOccurred())
		Expect(blockdev.FindLoops(backing)).To(BeEmpty())
		_, err = b.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		Expect(err).ToNot(HaveOccurred())
		Expect(filepath.Glob(filepath.Join(dir, "state", "staged", "*", id+".json"))).To(BeEmpty(), "no node's record left")
	})
})
