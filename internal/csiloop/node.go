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

package csiloop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.d.nodeID}, nil
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{
		nodeCapability(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME),
		nodeCapability(csi.NodeServiceCapability_RPC_EXPAND_VOLUME),
	}}, nil
}

func nodeCapability(t csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
	return &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
		Rpc: &csi.NodeServiceCapability_RPC{Type: t},
	}}
}

// stagedOn returns the record of the loop device volume id is staged on,
// nil when it is not staged. The record names the device; the device's
// inode decides, since a device the record names may have been detached by
// hand and taken by another file since: that one is not ours.
func (d *Driver) stagedOn(id string) (*stageRecord, error) {
	rec, err := d.state.staged(id)
	if err != nil || rec == nil {
		return nil, err
	}
	ours, err := d.loops.Backs(rec.Device, d.state.backingFile(id))
	if err != nil || !ours {
		return nil, err
	}
	return rec, nil
}

// unrecordedDevices are the loop devices of volume id that no other node
// recorded as its own: one this node's driver attached before it stopped
// without a record, since the nodes share the kernel and its devices.
func (d *Driver) unrecordedDevices(id string) ([]string, error) {
	devs, err := d.loops.Find(d.state.backingFile(id))
	if err != nil || len(devs) == 0 {
		return nil, err
	}
	others, err := d.state.stagedElsewhere(id)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(devs, func(dev string) bool {
		return slices.ContainsFunc(others, func(rec *stageRecord) bool { return rec.Device == dev })
	}), nil
}

// NodeStageVolume attaches the volume's file to a loop device and records
// which one, so that a later call, or a restarted driver, finds it again.
func (s *nodeServer) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, invalid("a volume ID is required")
	case path == "":
		return nil, invalid("a staging target path is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, invalid("%v", err)
	}
	readOnly := readOnlyMode(req.GetVolumeCapability())

	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.exists(id); err != nil {
		return nil, err
	}
	staged, err := d.stagedOn(id)
	if err != nil {
		return nil, internal(err)
	}
	if staged != nil {
		if staged.ReadOnly != readOnly {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged on %s with read-only %t", id, staged.Device, staged.ReadOnly)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	// Attached by a driver that stopped before it wrote the record?
	unrecorded, err := d.unrecordedDevices(id)
	if err != nil {
		return nil, internal(err)
	}
	var dev string
	attached := len(unrecorded) == 0
	if attached {
		if dev, err = d.loops.Attach(d.state.backingFile(id), readOnly); err != nil {
			return nil, internal(err)
		}
	} else {
		dev = unrecorded[0]
	}
	if err := d.state.setStaged(id, &stageRecord{Device: dev, StagingTargetPath: path, ReadOnly: readOnly}); err != nil {
		if attached {
			_ = d.loops.Detach(dev)
		}
		return nil, internal(err)
	}
	if attached {
		d.log.Info("staged volume", "volume", id, "device", dev)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume detaches the volume's loop device: the one recorded,
// and one a crash left unrecorded, each only when bound to the volume's
// own file. A volume that is not staged, or gone, is unstaged.
func (s *nodeServer) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, invalid("a volume ID is required")
	case path == "":
		return nil, invalid("a staging target path is required")
	}
	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !validID(id) {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	staged, err := d.stagedOn(id)
	if err != nil {
		return nil, internal(err)
	}
	dev := ""
	if staged != nil {
		dev = staged.Device
		if err := d.loops.Detach(dev); err != nil {
			return nil, internal(err)
		}
		d.log.Info("unstaged volume", "volume", id, "device", dev)
	}
	if _, err := os.Stat(d.state.backingFile(id)); err == nil {
		strays, err := d.unrecordedDevices(id)
		if err != nil {
			return nil, internal(err)
		}
		for _, stray := range strays {
			if stray == dev {
				continue
			}
			if err := d.loops.Detach(stray); err != nil {
				return nil, internal(err)
			}
			d.log.Info("detached an unrecorded loop device of the volume", "volume", id, "device", stray)
		}
	}
	if err := d.state.clearStaged(id); err != nil {
		return nil, internal(err)
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged loop device's node onto the
// file at the target path, which it creates; kubelet made its parent.
func (s *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, invalid("a volume ID is required")
	case target == "":
		return nil, invalid("a target path is required")
	case req.GetStagingTargetPath() == "":
		return nil, invalid("a staging target path is required: volumes are staged first")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, invalid("%v", err)
	}
	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.exists(id); err != nil {
		return nil, err
	}
	staged, err := d.stagedOn(id)
	if err != nil {
		return nil, internal(err)
	}
	if staged == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged", id)
	}
	dev := staged.Device
	if mounted, err := d.mounter.IsMountOf(dev, target); err != nil {
		return nil, internal(err)
	} else if mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	created, err := makeTarget(target)
	if err != nil {
		return nil, err
	}
	readOnly := req.GetReadonly() || staged.ReadOnly
	if err := d.mounter.BindDevice(dev, target, readOnly); err != nil {
		if created {
			_ = removeTarget(target)
		}
		return nil, internal(err)
	}
	d.log.Info("published volume", "volume", id, "device", dev, "target", target)
	return &csi.NodePublishVolumeResponse{}, nil
}

// makeTarget makes the file a device is bound onto, reporting whether it
// made it. A file already there (a publish that failed halfway) is reused;
// a device node there is another volume's.
func makeTarget(target string) (bool, error) {
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return false, internal(err)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return false, internal(err)
		}
		if err := f.Close(); err != nil {
			return false, internal(err)
		}
		return true, nil
	case err != nil:
		return false, internal(err)
	case fi.Mode().IsRegular():
		return false, nil
	case fi.Mode()&os.ModeDevice != 0:
		return false, status.Errorf(codes.AlreadyExists, "another device is published at %s", target)
	default:
		return false, invalid("%s is a %s: a Block volume is published on a file", target, fi.Mode().Type())
	}
}

// NodeUnpublishVolume unmounts the target and removes the file; a target
// that is gone is unpublished.
func (s *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, invalid("a volume ID is required")
	case target == "":
		return nil, invalid("a target path is required")
	}
	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.mounter.Unmount(target); err != nil {
		return nil, internal(err)
	}
	if err := removeTarget(target); err != nil {
		return nil, internal(err)
	}
	d.log.Info("unpublished volume", "volume", id, "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeExpandVolume makes the staged loop device take the size
// ControllerExpandVolume gave its file (LOOP_SET_CAPACITY): readers of the
// device, QEMU among them, see it at once. A volume that is not staged
// needs nothing: staging attaches the file at its size.
func (s *nodeServer) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	switch {
	case id == "":
		return nil, invalid("a volume ID is required")
	case req.GetVolumePath() == "":
		return nil, invalid("a volume path is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, invalid("%v", err)
		}
	}
	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	size, err := d.size(id)
	if err != nil {
		return nil, err
	}
	required := req.GetCapacityRange().GetRequiredBytes()
	if size < required {
		// Retried by kubelet: the controller grows the file first.
		return nil, status.Errorf(codes.Internal, "volume %s has %d bytes, fewer than the %d required: not grown by ControllerExpandVolume yet", id, size, required)
	}
	staged, err := d.stagedOn(id)
	if err != nil {
		return nil, internal(err)
	}
	if staged == nil {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	dev := staged.Device
	got, err := d.loops.RefreshCapacity(dev)
	if err != nil {
		return nil, internal(err)
	}
	if got < size {
		return nil, internal(fmt.Errorf("loop device %s has %d bytes after a refresh, its file %d", dev, got, size))
	}
	d.log.Info("expanded volume on the node", "volume", id, "device", dev, "bytes", got)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: got}, nil
}
