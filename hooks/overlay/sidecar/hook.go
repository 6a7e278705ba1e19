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

// Package sidecar is a KubeVirt hook sidecar that turns selected disks of a
// VMI into qcow2 overlays over their original source, as configured by the
// VMI annotation AnnotationKey. It serves KubeVirt's hook gRPC API
// (versions v1alpha2 and v1alpha3) and also runs as the onDefineDomain
// binary of KubeVirt's sidecar-shim.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"libvirt.org/go/libvirtxml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
)

// KubeVirt's mount layout in the compute container
// (pkg/virt-launcher/virtwrap/converter.GetFilesystemVolumePath).
const vmiDisksDir = "/var/run/kubevirt-private/vmi-disks"

// ephemeralSubdir holds ephemeral overlays inside the socket directory.
// virt-launcher takes every file of a sidecar's socket directory for a
// socket, but skips directories.
const ephemeralSubdir = "overlays"

// Environment is what the sidecar knows about the pod it runs in.
type Environment struct {
	// ContainerName is this container's name (CONTAINER_NAME).
	ContainerName string
	// SocketDir is this container's view of its hook socket directory,
	// an emptyDir shared with the compute container.
	SocketDir string
	// ComputeSocketDir is the compute container's view of SocketDir.
	ComputeSocketDir string
	// PodName is the name of the pod (its hostname).
	PodName string
}

// Hook does the work of OnDefineDomain and Shutdown.
type Hook struct {
	Env      Environment
	Overlays overlay.Manager
	// Log receives what the hook did; the zero Logger discards it.
	Log logr.Logger

	mu sync.Mutex
	// ephemeral are the ephemeral overlays this process created or
	// reused, removed at Shutdown.
	ephemeral map[string]overlay.Spec
}

// NewHook returns a hook that makes overlays with images and logs to log.
func NewHook(env Environment, images overlay.Images, log logr.Logger) *Hook {
	return &Hook{Env: env, Overlays: overlay.Manager{Images: images}, Log: log, ephemeral: map[string]overlay.Spec{}}
}

// plan is the work for one disk.
type plan struct {
	edit diskEdit
	spec overlay.Spec
}

// OnDefineDomain returns the domain with the configured disks turned into
// overlays, after making sure every overlay exists. It is idempotent:
// virt-launcher calls it twice per start (the second time with the domain
// the first call produced) and again in a migration target. Any problem is
// an error; the domain is never returned unchanged when an overlay was
// asked for.
func (h *Hook) OnDefineDomain(ctx context.Context, vmiJSON, domainXML []byte) ([]byte, error) {
	vmi, err := parseVMI(vmiJSON)
	if err != nil {
		return nil, err
	}
	text, ok := vmi.Metadata.Annotations[AnnotationKey]
	if !ok {
		return nil, fmt.Errorf("VMI %s/%s has no annotation %s: this sidecar only makes the overlays configured there",
			vmi.Metadata.Namespace, vmi.Metadata.Name, AnnotationKey)
	}
	cfg, err := ParseConfig(text)
	if err != nil {
		return nil, err
	}
	if len(cfg.Disks) == 0 {
		return domainXML, nil
	}
	disks, err := scanDisks(domainXML)
	if err != nil {
		return nil, err
	}
	plans, err := h.plan(vmi, cfg, disks)
	if err != nil {
		return nil, err
	}
	edits := make([]diskEdit, 0, len(plans))
	for _, p := range plans {
		res, err := h.Overlays.Ensure(ctx, p.spec)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %w", p.edit.Name, err)
		}
		if !p.spec.Persistent {
			h.mu.Lock()
			h.ephemeral[p.spec.Path] = p.spec
			h.mu.Unlock()
		}
		h.Log.Info("overlay ready", "disk", p.edit.Name, "overlay", p.edit.Overlay,
			"backing", res.Record.Backing.Path, "created", res.Created, "persistent", p.spec.Persistent)
		edits = append(edits, p.edit)
	}
	return editDomain(domainXML, disks, edits)
}

func (h *Hook) plan(vmi *vmiObject, cfg *Config, disks map[string]*domainDisk) ([]plan, error) {
	var pvc *sidecarPVC
	target := vmi.migrationTargetOf(h.Env.PodName)
	plans := make([]plan, 0, len(cfg.Disks))
	for _, dc := range cfg.Disks {
		if !vmi.hasDisk(dc.Name) {
			return nil, fmt.Errorf("annotation %s: VMI has no disk %q", AnnotationKey, dc.Name)
		}
		vol, ok := vmi.volume(dc.Name)
		if !ok {
			return nil, fmt.Errorf("annotation %s: VMI has no volume %q", AnnotationKey, dc.Name)
		}
		if vol.hotpluggable() {
			return nil, fmt.Errorf("annotation %s: volume %q is hotpluggable; overlays are made at start only", AnnotationKey, dc.Name)
		}
		dd, ok := disks[dc.Name]
		if !ok {
			return nil, fmt.Errorf("disk %s: the domain has no disk with alias %s%s", dc.Name, userAliasPrefix, dc.Name)
		}
		if (dc.Persistent || dc.Backing != "") && pvc == nil {
			var err error
			if pvc, err = vmi.ownPVC(h.Env.ContainerName); err != nil {
				return nil, fmt.Errorf("disk %s: %w", dc.Name, err)
			}
		}
		if target && !dc.Persistent {
			return nil, fmt.Errorf("disk %s: an ephemeral overlay lives in its pod and cannot follow a live migration", dc.Name)
		}
		p, err := h.planDisk(vmi, cfg, dc, dd, pvc)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %w", dc.Name, err)
		}
		p.spec.InUse = target
		plans = append(plans, p)
	}
	return plans, nil
}

func (h *Hook) planDisk(vmi *vmiObject, cfg *Config, dc DiskConfig, dd *domainDisk, pvc *sidecarPVC) (plan, error) {
	disk := dd.disk
	if disk.Device != "" && disk.Device != "disk" {
		return plan{}, fmt.Errorf("device is a %s; only disks can be overlays", disk.Device)
	}
	if disk.Shareable != nil {
		return plan{}, fmt.Errorf("a shareable disk cannot be an overlay")
	}

	var local, compute string
	if dc.Persistent {
		rel := dc.Path
		if rel == "" {
			rel = path.Join(vmi.Metadata.Namespace, vmi.Metadata.Name, dc.Name+".qcow2")
		}
		local = filepath.Join(pvc.VolumePath, rel)
		compute = filepath.Join(pvc.SharedComputePath, rel)
	} else {
		local = filepath.Join(h.Env.SocketDir, ephemeralSubdir, dc.Name+".qcow2")
		compute = filepath.Join(h.Env.ComputeSocketDir, ephemeralSubdir, dc.Name+".qcow2")
	}

	// The original source: the configured backing on the sidecar's claim,
	// the disk's own source, or the backing store of a disk this hook
	// already converted (the second call of a start).
	src, format := disk.Source, ""
	if disk.Driver != nil {
		format = disk.Driver.Type
	}
	if dc.Backing != "" {
		src = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: path.Join(pvc.SharedComputePath, dc.Backing)}}
		format = "raw"
	}
	current := sourcePath(disk.Source)
	switch {
	case current == compute:
		if disk.BackingStore == nil || disk.BackingStore.Source == nil {
			return plan{}, fmt.Errorf("the domain already uses overlay %s but names no backing store", compute)
		}
		src = disk.BackingStore.Source
		if disk.BackingStore.Format != nil {
			format = disk.BackingStore.Format.Type
		}
	case dc.Backing != "":
		// The disk's own source only held the place.
	case disk.BackingStore != nil && disk.BackingStore.Source != nil:
		return plan{}, fmt.Errorf("source %s already has a backing chain; only plain file or block sources can get an overlay", current)
	case current == "":
		return plan{}, fmt.Errorf("source is neither a file nor a block device")
	case src.DataStore != nil:
		return plan{}, fmt.Errorf("source %s has an external data store", current)
	}
	if dc.BackingFormat != "" {
		format = dc.BackingFormat
	}
	if format != "raw" && format != "qcow2" {
		return plan{}, fmt.Errorf("backing format %q is not raw or qcow2; set backingFormat", format)
	}
	backing := sourcePath(src)
	localBacking := h.localPath(vmi, pvc, backing)
	if _, err := os.Stat(localBacking); err != nil {
		return plan{}, fmt.Errorf("backing %s is not visible to the sidecar (%w): the sidecar reads the backing through "+
			"its hookSidecars pvc, so the backing must be on that claim", backing, err)
	}
	spec := overlay.Spec{
		Path:       local,
		Backing:    overlay.Backing{Path: backing, Format: format, LocalPath: localBacking},
		Persistent: dc.Persistent,
		Size:       int64(dc.Size),
		Identity:   cfg.Identity,
		Options: overlay.CreateOptions{
			ClusterSize:   int64(cfg.Create.ClusterSize),
			ExtendedL2:    cfg.Create.ExtendedL2,
			LazyRefcounts: cfg.Create.LazyRefcounts,
		},
	}
	edit := diskEdit{Name: dc.Name, Overlay: compute, Backing: withoutIndex(src), BackingFormat: format,
		DropSource: dc.Backing != "" && current != compute}
	return plan{edit: edit, spec: spec}, nil
}

// localPath maps a path of the compute container to the same file in this
// container, through the directories both see.
func (h *Hook) localPath(vmi *vmiObject, pvc *sidecarPVC, computePath string) string {
	type mount struct{ compute, local string }
	mounts := []mount{{h.Env.ComputeSocketDir, h.Env.SocketDir}}
	if pvc == nil {
		// Ephemeral overlays can read their backing from the PVC too.
		if p, err := vmi.ownPVC(h.Env.ContainerName); err == nil {
			pvc = p
		}
	}
	if pvc != nil {
		mounts = append(mounts, mount{pvc.SharedComputePath, pvc.VolumePath})
		// A VMI volume on the sidecar's own claim.
		for _, vol := range vmi.Spec.Volumes {
			if vol.claimName() == pvc.Name && pvc.Name != "" {
				mounts = append(mounts, mount{path.Join(vmiDisksDir, vol.Name), pvc.VolumePath})
			}
		}
	}
	for _, m := range mounts {
		if m.compute == "" || m.local == "" {
			continue
		}
		if rel, ok := strings.CutPrefix(computePath, m.compute+"/"); ok {
			return filepath.Join(m.local, rel)
		}
	}
	return computePath
}

// withoutIndex drops the index libvirt assigns to a live source: a backing
// store in a definition carries none.
func withoutIndex(s *libvirtxml.DomainDiskSource) *libvirtxml.DomainDiskSource {
	c := *s
	c.Index = 0
	return &c
}

// Shutdown removes the ephemeral overlays this process made. virt-launcher
// calls it when the VM has stopped; the pod's emptyDir goes with the pod
// anyway, this frees the space sooner.
func (h *Hook) Shutdown() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for p, spec := range h.ephemeral {
		if err := h.Overlays.Remove(spec); err != nil {
			errs = append(errs, err)
			continue
		}
		h.Log.Info("removed ephemeral overlay", "overlay", p)
		delete(h.ephemeral, p)
	}
	return errors.Join(errs...)
}
