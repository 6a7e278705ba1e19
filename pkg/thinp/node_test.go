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

package thinp_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

// A qcow2 overlay on a block device over a raw backing file, as libvirt
// shows a running domain's disk.
const overlayOnBlock = `<domain type='kvm'><name>g</name><devices>
  <disk type='file' device='cdrom'><source file='/images/cd.iso' index='4'/><target dev='sda' bus='sata'/></disk>
  <disk type='block' device='disk'>
    <driver name='qemu' type='qcow2'/>
    <source dev='/dev/loop3' index='2'/>
    <backingStore type='file' index='1'><format type='raw'/><source file='/images/base.raw'/><backingStore/></backingStore>
    <target dev='vda' bus='virtio'/><alias name='virtio-disk0'/>
  </disk></devices></domain>`

// The block device holds a lower layer under a file snapshot.
const snapshotOverBlock = `<domain type='kvm'><name>g</name><devices>
  <disk type='file' device='disk'>
    <driver name='qemu' type='qcow2'/>
    <source file='/images/snap.qcow2' index='3'/>
    <backingStore type='block' index='2'><format type='qcow2'/><source dev='/dev/loop3'/>
      <backingStore type='file' index='1'><format type='raw'/><source file='/images/base.raw'/><backingStore/></backingStore>
    </backingStore>
    <target dev='vdb' bus='virtio'/><alias name='ua-data'/>
  </disk></devices></domain>`

const rawOnBlock = `<domain type='kvm'><name>g</name><devices>
  <disk type='block' device='disk'><driver name='qemu' type='raw'/><source dev='/dev/loop3' index='1'/><target dev='vda' bus='virtio'/></disk>
  </devices></domain>`

const noIndex = `<domain type='kvm'><name>g</name><devices>
  <disk type='block' device='disk'><driver name='qemu' type='qcow2'/><source dev='/dev/loop3'/><target dev='vda' bus='virtio'/></disk>
  </devices></domain>`

var _ = DescribeTable("ResolveNode",
	func(domainXML, target, path string, want thinp.Node, message string) {
		node, err := thinp.ResolveNode(domainXML, target, path)
		if message != "" {
			Expect(err).To(MatchError(ContainSubstring(message)))
			return
		}
		Expect(err).ToNot(HaveOccurred())
		Expect(node).To(Equal(want))
	},
	Entry("the active overlay on a block device", overlayOnBlock, "vda", "",
		thinp.Node{Target: "vda", Index: 2, Name: "vda[2]", Path: "/dev/loop3", Alias: "virtio-disk0", Active: true}, ""),
	Entry("the same, named by its device", overlayOnBlock, "vda", "/dev/loop3",
		thinp.Node{Target: "vda", Index: 2, Name: "vda[2]", Path: "/dev/loop3", Alias: "virtio-disk0", Active: true}, ""),
	Entry("a backing layer on a block device", snapshotOverBlock, "vdb", "",
		thinp.Node{Target: "vdb", Index: 2, Name: "vdb[2]", Path: "/dev/loop3", Alias: "ua-data", Active: false}, ""),
	Entry("no index attributes", noIndex, "vda", "",
		thinp.Node{Target: "vda", Name: "vda", Path: "/dev/loop3", Active: true}, ""),
	Entry("a raw image", rawOnBlock, "vda", "", thinp.Node{}, "image on /dev/loop3 is raw, not qcow2"),
	Entry("another device", overlayOnBlock, "vda", "/dev/loop9", thinp.Node{}, "no image of its chain is on /dev/loop9"),
	Entry("a disk on files only", overlayOnBlock, "sda", "", thinp.Node{}, "no image of its chain is on a block device"),
	Entry("no such disk", overlayOnBlock, "vdz", "", thinp.Node{}, "the domain has no such disk"),
	Entry("broken XML", "<domain", "vda", "", thinp.Node{}, "parse domain XML"),
)
