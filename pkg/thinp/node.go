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

package thinp

import (
	"fmt"

	"libvirt.org/go/libvirtxml"
)

// Node is the image of a disk's chain that sits on the monitored block
// device, as the live domain XML names it.
type Node struct {
	// Target is the disk's target device, e.g. "vda".
	Target string
	// Index is libvirt's index of the image in the chain (the index
	// attribute of its source or backingStore element); 0 when libvirt
	// gave none.
	Index uint
	// Name is what libvirt calls the node in block threshold calls and
	// events: "vda[2]", or the target alone when there is no index.
	Name string
	// Path is the image's block device.
	Path string
	// Alias is the disk's device alias, as io-error events name it.
	Alias string
	// Active tells whether the image is the top of the chain, the one
	// the guest writes to.
	Active bool
}

// ResolveNode finds, in a running domain's XML, the image of disk target
// that lives on block device path; an empty path means the first image of
// the chain, from the top, that is a block device.
func ResolveNode(domainXML, target, path string) (Node, error) {
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(domainXML); err != nil {
		return Node{}, fmt.Errorf("resolve disk %s: parse domain XML: %w", target, err)
	}
	if dom.Devices == nil {
		return Node{}, fmt.Errorf("resolve disk %s: domain has no devices", target)
	}
	for _, disk := range dom.Devices.Disks {
		if disk.Target == nil || disk.Target.Dev != target {
			continue
		}
		node := Node{Target: target, Active: true}
		if disk.Alias != nil {
			node.Alias = disk.Alias.Name
		}
		source, format := disk.Source, disk.Driver
		var formatType string
		if format != nil {
			formatType = format.Type
		}
		backing := disk.BackingStore
		for source != nil {
			if dev := blockPath(source); dev != "" && (path == "" || dev == path) {
				if formatType != "" && formatType != "qcow2" {
					return Node{}, fmt.Errorf("resolve disk %s: image on %s is %s, not qcow2", target, dev, formatType)
				}
				node.Index, node.Path = source.Index, dev
				node.Name = target
				if source.Index > 0 {
					node.Name = fmt.Sprintf("%s[%d]", target, source.Index)
				}
				return node, nil
			}
			if backing == nil {
				break
			}
			node.Active = false
			source, formatType = backing.Source, ""
			if backing.Format != nil {
				formatType = backing.Format.Type
			}
			// libvirt puts a layer's index on its backingStore element.
			if source != nil && source.Index == 0 {
				source.Index = backing.Index
			}
			backing = backing.BackingStore
		}
		if path == "" {
			return Node{}, fmt.Errorf("resolve disk %s: no image of its chain is on a block device", target)
		}
		return Node{}, fmt.Errorf("resolve disk %s: no image of its chain is on %s", target, path)
	}
	return Node{}, fmt.Errorf("resolve disk %s: the domain has no such disk", target)
}

func blockPath(s *libvirtxml.DomainDiskSource) string {
	if s.Block != nil {
		return s.Block.Dev
	}
	return ""
}
