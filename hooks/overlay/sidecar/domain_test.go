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

package sidecar

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"

	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
)

var _ = Describe("Domain editing", func() {
	for name, f := range fixtures() {
		Context("on a KubeVirt domain with a "+name+" root disk", func() {
			var doc []byte

			BeforeEach(func() {
				doc = f.domainXML()
			})

			It("finds every disk the user declared by its name", func() {
				disks, err := scanDisks(doc)
				Expect(err).ToNot(HaveOccurred())
				Expect(disks).To(HaveLen(len(f.vmi.Spec.Domain.Devices.Disks)))
				for _, d := range f.vmi.Spec.Domain.Devices.Disks {
					Expect(disks).To(HaveKey(d.Name))
					Expect(string(doc[disks[d.Name].start:disks[d.Name].end])).To(HavePrefix("<disk"))
				}
			})

			It("keeps KubeVirt's own children of a disk that libvirtxml does not know", func() {
				disks, err := scanDisks(doc)
				Expect(err).ToNot(HaveOccurred())
				var names []string
				for _, x := range disks["rootdisk"].extra {
					names = append(names, x.XMLName.Local)
				}
				Expect(names).To(ConsistOf("filesystemOverhead", "capacity", "expandDisksEnabled"))
			})

			It("turns the disk into an overlay and changes nothing else, as KubeVirt reads it back", func() {
				before := &api.DomainSpec{}
				Expect(xml.Unmarshal(doc, before)).To(Succeed())
				disks, err := scanDisks(doc)
				Expect(err).ToNot(HaveOccurred())
				root := disks["rootdisk"]
				edit := diskEdit{Name: "rootdisk", Overlay: "/var/run/overlays/rootdisk.qcow2", Backing: root.disk.Source, BackingFormat: "raw"}

				out, err := editDomain(doc, disks, []diskEdit{edit})
				Expect(err).ToNot(HaveOccurred())
				Expect(out[:root.start]).To(Equal(doc[:root.start]), "bytes before the disk")
				Expect(out[len(out)-(len(doc)-int(root.end)):]).To(Equal(doc[root.end:]), "bytes after the disk")

				// virt-launcher unmarshals the hook's answer into its own
				// DomainSpec: everything but the edited fields must match.
				after := &api.DomainSpec{}
				Expect(xml.Unmarshal(out, after)).To(Succeed())
				want := before.DeepCopy()
				d := &want.Devices.Disks[0]
				Expect(d.Alias.GetName()).To(Equal("rootdisk"))
				orig := d.Source
				orig.Name = "" // KubeVirt's bookkeeping on block sources; libvirt ignores it
				d.BackingStore = &api.BackingStore{Type: d.Type, Format: &api.BackingStoreFormat{Type: "raw"}, Source: &orig}
				d.Type = "file"
				d.Driver.Type = "qcow2"
				d.Source = api.DiskSource{File: "/var/run/overlays/rootdisk.qcow2"}
				Expect(after).To(Equal(want))

				Expect(lostParts(doc, out, []string{"rootdisk"})).To(BeEmpty())
			})

			It("edits several disks at once", func() {
				disks, err := scanDisks(doc)
				Expect(err).ToNot(HaveOccurred())
				edits := []diskEdit{
					{Name: "satadisk", Overlay: "/o/sata.qcow2", Backing: disks["satadisk"].disk.Source, BackingFormat: "raw"},
					{Name: "rootdisk", Overlay: "/o/system.qcow2", Backing: disks["rootdisk"].disk.Source, BackingFormat: "qcow2"},
				}
				out, err := editDomain(doc, disks, edits)
				Expect(err).ToNot(HaveOccurred())
				Expect(lostParts(doc, out, []string{"rootdisk", "satadisk"})).To(BeEmpty())

				again, err := scanDisks(out)
				Expect(err).ToNot(HaveOccurred())
				Expect(again["satadisk"].disk.Source.File.File).To(Equal("/o/sata.qcow2"))
				Expect(again["rootdisk"].disk.BackingStore.Format.Type).To(Equal("qcow2"))
				Expect(again["datadisk"].disk).To(Equal(disks["datadisk"].disk))
			})
		})
	}

	DescribeTable("refuses documents that are not domains",
		func(doc, message string) {
			_, err := scanDisks([]byte(doc))
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("not XML", "{}", "parse domain XML"),
		Entry("another root", "<network/>", "root element is <network>"),
		Entry("two roots", "<domain/><domain/>", "not one <domain>"),
		Entry("truncated", "<domain><devices><disk type='file'>", "parse domain XML"),
		Entry("two disks with one alias", `<domain><devices><disk><alias name="ua-a"/></disk><disk><alias name="ua-a"/></disk></devices></domain>`, "two disks with alias ua-a"),
	)
})

// lostParts lists what of doc is missing from out, apart from what editing
// the named disks replaces on purpose: the disk's type and driver type,
// and its source, which must reappear as the backing store's source.
// Parts are element paths with attributes and text, counted.
func lostParts(doc, out []byte, edited []string) []string {
	GinkgoHelper()
	before, err := flatten(doc, edited)
	Expect(err).ToNot(HaveOccurred())
	after, err := flatten(out, nil)
	Expect(err).ToNot(HaveOccurred())
	var lost []string
	for part, n := range before {
		if after[part] < n {
			lost = append(lost, fmt.Sprintf("%s (%d of %d)", part, after[part], n))
		}
	}
	sort.Strings(lost)
	return lost
}

// flatten turns a document into counted parts. Inside an edited disk, the
// source is renamed to where an overlay keeps it, and the parts an edit
// replaces are left out.
func flatten(doc []byte, edited []string) (map[string]int, error) {
	parts := map[string]int{}
	d := xml.NewDecoder(bytes.NewReader(doc))
	type frame struct {
		path   string
		inDisk bool
	}
	var stack []frame
	// Disks are matched by alias, which comes late in the element: collect
	// each disk's parts, then rename them once the alias is known.
	var diskParts []string
	var diskAlias string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return parts, nil
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			parent := frame{}
			if len(stack) > 0 {
				parent = stack[len(stack)-1]
			}
			p := parent.path + "/" + t.Name.Local
			f := frame{path: p, inDisk: parent.inDisk || p == "/domain/devices/disk"}
			stack = append(stack, f)
			attrs := make([]string, 0, len(t.Attr))
			for _, a := range t.Attr {
				attrs = append(attrs, p+"@"+a.Name.Local+"="+a.Value)
				if p == "/domain/devices/disk/alias" && a.Name.Local == "name" {
					diskAlias = a.Value
				}
			}
			if f.inDisk {
				diskParts = append(diskParts, p)
				diskParts = append(diskParts, attrs...)
			} else {
				parts[p]++
				for _, a := range attrs {
					parts[a]++
				}
			}
		case xml.CharData:
			text := strings.TrimSpace(string(t))
			if text == "" || len(stack) == 0 {
				continue
			}
			part := stack[len(stack)-1].path + "#" + text
			if stack[len(stack)-1].inDisk {
				diskParts = append(diskParts, part)
			} else {
				parts[part]++
			}
		case xml.EndElement:
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if top.path != "/domain/devices/disk" {
				continue
			}
			isEdited := false
			for _, name := range edited {
				isEdited = isEdited || diskAlias == userAliasPrefix+name
			}
			for _, part := range diskParts {
				if isEdited {
					var ok bool
					if part, ok = editedPart(part); !ok {
						continue
					}
				}
				parts[part]++
			}
			diskParts, diskAlias = nil, ""
		}
	}
}

// editedPart maps a part of a disk to what it becomes in its overlay.
func editedPart(part string) (string, bool) {
	const disk = "/domain/devices/disk"
	switch {
	case strings.HasPrefix(part, disk+"@type="), strings.HasPrefix(part, disk+"/driver@type="):
		return "", false
	case strings.HasPrefix(part, disk+"/source@name="), strings.HasPrefix(part, disk+"/source@index="):
		// KubeVirt's bookkeeping, libvirt's runtime index.
		return "", false
	case strings.HasPrefix(part, disk+"/source"):
		return disk + "/backingStore/source" + strings.TrimPrefix(part, disk+"/source"), true
	}
	return part, true
}

var _ = Describe("lostParts", func() {
	It("notices an attribute and an element that went missing", func() {
		doc := []byte(`<domain><name>a</name><devices><disk type="file"><alias name="ua-x"/><serial>s</serial></disk></devices><memory unit="b">1</memory></domain>`)
		out := []byte(`<domain><name>a</name><devices><disk type="file"><alias name="ua-x"/></disk></devices><memory>1</memory></domain>`)
		Expect(lostParts(doc, out, nil)).To(ConsistOf(
			"/domain/devices/disk/serial (0 of 1)",
			"/domain/devices/disk/serial#s (0 of 1)",
			"/domain/memory@unit=b (0 of 1)",
		))
	})
})

var _ = Describe("checkNothingLost", func() {
	DescribeTable("refuses an edit that would drop what libvirtxml does not know",
		func(disk, lost string) {
			dd, err := decodeDisk([]byte(disk))
			Expect(err).ToNot(HaveOccurred())
			_, err = overlayDisk(dd, diskEdit{Name: "a", Overlay: "/o.qcow2", Backing: dd.disk.Source, BackingFormat: "raw"})
			Expect(err).To(MatchError(ContainSubstring("the overlay disk would lose " + lost)))
		},
		Entry("an unknown attribute", `<disk type="file"><driver name="qemu" type="raw" future="yes"/><source file="/a"/><alias name="ua-a"/></disk>`,
			"disk/driver@future=yes"),
		Entry("an unknown grandchild", `<disk type="file"><driver name="qemu" type="raw"><tuning/></driver><source file="/a"/><alias name="ua-a"/></disk>`,
			"disk/driver/tuning"),
		Entry("a repeated element", `<disk type="file"><source file="/a"/><serial>x</serial><serial>y</serial><alias name="ua-a"/></disk>`,
			"disk/serial#x"),
	)
})

// libvirtxml is the reference for what a disk means: the edited disk must
// decode to the expected structure.
var _ = Describe("overlayDisk", func() {
	It("renders the overlay source, the backing store and the kept children", func() {
		dd, err := decodeDisk([]byte(`<disk type="block" device="disk"><driver name="qemu" type="raw" cache="none"/>` +
			`<source dev="/dev/rootdisk" name="rootdisk"/><target bus="virtio" dev="vda"/><alias name="ua-rootdisk"/>` +
			`<capacity>1024</capacity></disk>`))
		Expect(err).ToNot(HaveOccurred())
		out, err := overlayDisk(dd, diskEdit{Name: "rootdisk", Overlay: "/o.qcow2", Backing: dd.disk.Source, BackingFormat: "raw"})
		Expect(err).ToNot(HaveOccurred())
		got := libvirtxml.DomainDisk{}
		Expect(xml.Unmarshal(out, &got)).To(Succeed())
		Expect(got.Driver).To(Equal(&libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2", Cache: "none"}))
		Expect(got.Source.File.File).To(Equal("/o.qcow2"))
		Expect(got.BackingStore.Format.Type).To(Equal("raw"))
		Expect(got.BackingStore.Source.Block.Dev).To(Equal("/dev/rootdisk"))
		Expect(string(out)).To(HaveSuffix("<capacity>1024</capacity></disk>"))
	})
})
