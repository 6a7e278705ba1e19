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
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{
		controllerCapability(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME),
		controllerCapability(csi.ControllerServiceCapability_RPC_EXPAND_VOLUME),
	}}, nil
}

func controllerCapability(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
	return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
	}}
}

// CreateVolume makes a sparse file of the requested size. The volume's ID
// follows from its name, so a repeated call finds the volume it made and
// returns it again, or ALREADY_EXISTS when its size does not fit the new
// request.
func (s *controllerServer) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, invalid("a volume name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, invalid("%v", err)
	}
	if req.GetVolumeContentSource() != nil {
		return nil, invalid("volumes from snapshots or other volumes are not served")
	}
	if len(req.GetParameters()) > 0 {
		return nil, invalid("no StorageClass parameters are known, got %v", keys(req.GetParameters()))
	}
	size, err := createSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}

	d := s.d
	id := volumeID(name)
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := d.state.volume(id)
	if err != nil {
		return nil, internal(err)
	}
	if rec != nil {
		if rec.Name != name {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s was made for the name %q", id, rec.Name)
		}
		current, err := d.state.size(id)
		if err != nil {
			return nil, internal(err)
		}
		if !fits(current, req.GetCapacityRange()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with %d bytes, outside the requested range", name, current)
		}
		return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: current}}, nil
	}
	if err := d.state.create(id, &volumeRecord{Name: name, AccessType: accessTypeBlock}, size); err != nil {
		return nil, internal(err)
	}
	d.log.Info("created volume", "volume", id, "bytes", size)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: size}}, nil
}

// DeleteVolume removes a volume; one that does not exist is already
// deleted. A volume still on a loop device is in use.
func (s *controllerServer) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("a volume ID is required")
	}
	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, err := d.state.volume(id)
	if err != nil {
		return nil, internal(err)
	}
	if rec == nil {
		return &csi.DeleteVolumeResponse{}, nil
	}
	devs, err := d.loops.Find(d.state.backingFile(id))
	if err != nil {
		return nil, internal(err)
	}
	if len(devs) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged on %s: unstage it first", id, strings.Join(devs, ", "))
	}
	if err := d.state.remove(id); err != nil {
		return nil, internal(err)
	}
	d.log.Info("deleted volume", "volume", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms Block on one node, without
// parameters or volume context (the driver makes none).
func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("a volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume capabilities are required")
	}
	if err := s.d.exists(id); err != nil {
		return nil, err
	}
	// What is not confirmed is an answer, with the reason, not an error.
	var unconfirmed string
	switch {
	case len(req.GetParameters()) > 0:
		unconfirmed = "no parameters are known"
	case len(req.GetVolumeContext()) > 0:
		unconfirmed = "volumes carry no context"
	default:
		if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			unconfirmed = err.Error()
		}
	}
	if unconfirmed != "" {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: unconfirmed}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities(),
	}}, nil
}

// ControllerExpandVolume grows the volume's file, never shrinks it, and
// asks for node expansion: the loop device on the node takes the new size
// only when told (NodeExpandVolume). With GrowStagedOnExpand the devices
// of a staged volume are told here already.
func (s *controllerServer) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("a volume ID is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("a capacity range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, invalid("%v", err)
		}
	}
	size, err := expandSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}

	d := s.d
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	current, err := d.size(id)
	if err != nil {
		return nil, err
	}
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && current > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes, more than the limit %d: volumes do not shrink", id, current, limit)
	}
	if current < size {
		if err := d.state.grow(id, size); err != nil {
			return nil, internal(err)
		}
		d.log.Info("grew volume", "volume", id, "from", current, "to", size)
		current = size
	}
	if d.growStaged {
		d.refreshStaged(id)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: current, NodeExpansionRequired: true}, nil
}

// refreshStaged makes every loop device of a staged volume, whichever
// node staged it, take its file's size: the nodes share the kernel, as a
// mapped Ceph RBD image grows on every client at once. A failure is only
// logged: NodeExpandVolume does it again on each node.
func (d *Driver) refreshStaged(id string) {
	devs, err := d.loops.Find(d.state.backingFile(id))
	if err != nil {
		d.log.Error(err, "refresh a staged volume", "volume", id)
		return
	}
	for _, dev := range devs {
		got, err := d.loops.RefreshCapacity(dev)
		if err != nil {
			d.log.Error(err, "refresh a staged volume", "volume", id, "device", dev)
			continue
		}
		d.log.Info("refreshed a loop device of a staged volume", "volume", id, "device", dev, "bytes", got)
	}
}

// createSize is the size a new volume gets: the required bytes, or the
// default size, rounded up to the alignment and within the limit.
func createSize(r *csi.CapacityRange) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, invalid("negative capacity range [%d, %d]", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, invalid("required bytes %d exceed the limit %d", required, limit)
	}
	size := required
	if size == 0 {
		size = DefaultVolumeSize
		if limit > 0 && limit < size {
			size = limit
		}
	}
	return align(size, required, limit)
}

// expandSize is the size an expanded volume gets at least.
func expandSize(r *csi.CapacityRange) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required <= 0 || limit < 0 {
		return 0, invalid("capacity range [%d, %d]: required bytes must be positive", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, invalid("required bytes %d exceed the limit %d", required, limit)
	}
	return align(required, required, limit)
}

// align rounds size up to the alignment, or down to fit the limit; no
// aligned size at least required and at most limit is OUT_OF_RANGE.
func align(size, required, limit int64) (int64, error) {
	size = (size + sizeAlignment - 1) &^ (sizeAlignment - 1)
	if limit > 0 && size > limit {
		size = limit &^ (sizeAlignment - 1)
	}
	if size == 0 || size < required {
		return 0, status.Errorf(codes.OutOfRange, "no multiple of %d bytes lies in [%d, %d]", sizeAlignment, required, limit)
	}
	return size, nil
}

// fits reports whether an existing volume of size bytes answers r.
func fits(size int64, r *csi.CapacityRange) bool {
	return size >= r.GetRequiredBytes() && (r.GetLimitBytes() == 0 || size <= r.GetLimitBytes())
}

func keys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
