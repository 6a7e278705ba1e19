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
	"unicode/utf8"

	"libvirt.org/go/libvirtxml"
)

// userAliasPrefix is how KubeVirt names the alias of a device the user
// declared (api.NewUserDefinedAlias): disk "rootdisk" is alias
// "ua-rootdisk".
const userAliasPrefix = "ua-"

// domainDisk is one <disk> of <devices> as it stands in the document.
type domainDisk struct {
	// start and end delimit the element's bytes in the document.
	start, end int64
	raw        []byte
	disk       libvirtxml.DomainDisk
	// extra are the disk's children libvirtxml does not know (KubeVirt
	// keeps its own bookkeeping there, e.g. <capacity>), kept verbatim.
	extra []rawElement
}

// rawElement is an element carried through without interpretation.
type rawElement struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Inner   []byte     `xml:",innerxml"`
}

type rawChildren struct {
	Children []rawElement `xml:",any"`
}

// scanDisks finds the disks of a domain document by their KubeVirt disk
// name. Only the disks are decoded: the rest of the document is never
// re-serialised, so nothing outside the disks that change can be lost.
func scanDisks(doc []byte) (map[string]*domainDisk, error) {
	d := xml.NewDecoder(bytes.NewReader(doc))
	disks := map[string]*domainDisk{}
	var path []string
	sawRoot := false
	for {
		offset := d.InputOffset()
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parse domain XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if len(path) == 0 {
				if t.Name.Local != "domain" || sawRoot {
					return nil, fmt.Errorf("parse domain XML: root element is <%s>, not one <domain>", t.Name.Local)
				}
				sawRoot = true
			}
			if len(path) == 2 && path[1] == "devices" && t.Name.Local == "disk" {
				if err := d.Skip(); err != nil {
					return nil, fmt.Errorf("parse domain XML: %w", err)
				}
				dd, err := decodeDisk(doc[offset:d.InputOffset()])
				if err != nil {
					return nil, err
				}
				dd.start, dd.end = offset, d.InputOffset()
				if dd.disk.Alias == nil || len(dd.disk.Alias.Name) <= len(userAliasPrefix) ||
					dd.disk.Alias.Name[:len(userAliasPrefix)] != userAliasPrefix {
					continue
				}
				name := dd.disk.Alias.Name[len(userAliasPrefix):]
				if _, dup := disks[name]; dup {
					return nil, fmt.Errorf("parse domain XML: two disks with alias %s", dd.disk.Alias.Name)
				}
				disks[name] = dd
				continue
			}
			path = append(path, t.Name.Local)
		case xml.EndElement:
			path = path[:len(path)-1]
		}
	}
	if !sawRoot || len(path) != 0 {
		return nil, fmt.Errorf("parse domain XML: no complete <domain> element")
	}
	return disks, nil
}

func decodeDisk(raw []byte) (*domainDisk, error) {
	dd := &domainDisk{raw: raw}
	if err := xml.Unmarshal(raw, &dd.disk); err != nil {
		return nil, fmt.Errorf("parse domain disk: %w", err)
	}
	known, err := xml.Marshal(&dd.disk)
	if err != nil {
		return nil, fmt.Errorf("parse domain disk: %w", err)
	}
	var all, kept rawChildren
	if err := xml.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("parse domain disk: %w", err)
	}
	if err := xml.Unmarshal(known, &kept); err != nil {
		return nil, fmt.Errorf("parse domain disk: %w", err)
	}
	seen := map[string]int{}
	for _, c := range kept.Children {
		seen[c.XMLName.Local]++
	}
	for _, c := range all.Children {
		if seen[c.XMLName.Local] > 0 {
			seen[c.XMLName.Local]--
			continue
		}
		dd.extra = append(dd.extra, c)
	}
	return dd, nil
}

// diskEdit turns one disk into a qcow2 overlay over its original source.
type diskEdit struct {
	// Name is the KubeVirt disk name.
	Name string
	// Overlay is the overlay's path as QEMU opens it.
	Overlay string
	// Backing is the original source; BackingFormat its format.
	Backing       *libvirtxml.DomainDiskSource
	BackingFormat string
	// DropSource: the disk's own source held the place of Backing and
	// goes.
	DropSource bool
}

// editDomain applies edits to the disks of doc and returns the new
// document. Bytes outside the edited disks are copied unchanged.
func editDomain(doc []byte, disks map[string]*domainDisk, edits []diskEdit) ([]byte, error) {
	type replacement struct {
		start, end int64
		data       []byte
	}
	var reps []replacement
	for _, e := range edits {
		dd, ok := disks[e.Name]
		if !ok {
			return nil, fmt.Errorf("edit domain: no disk %s", e.Name)
		}
		data, err := overlayDisk(dd, e)
		if err != nil {
			return nil, fmt.Errorf("edit domain disk %s: %w", e.Name, err)
		}
		reps = append(reps, replacement{dd.start, dd.end, data})
	}
	// Apply in document order.
	for i := 1; i < len(reps); i++ {
		for j := i; j > 0 && reps[j].start < reps[j-1].start; j-- {
			reps[j], reps[j-1] = reps[j-1], reps[j]
		}
	}
	var out bytes.Buffer
	out.Grow(len(doc) + 512*len(reps))
	pos := int64(0)
	for _, r := range reps {
		out.Write(doc[pos:r.start])
		out.Write(r.data)
		pos = r.end
	}
	out.Write(doc[pos:])
	return out.Bytes(), nil
}

// overlayDisk renders the disk with the overlay as its source and the
// original source as its backing store; every other part of the disk,
// KubeVirt's own children included, is kept.
func overlayDisk(dd *domainDisk, e diskEdit) ([]byte, error) {
	if !xmlText(e.Overlay) {
		return nil, fmt.Errorf("overlay path %q cannot be written in XML", e.Overlay)
	}
	disk := dd.disk
	if disk.Driver == nil {
		disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu"}
	} else {
		drv := *disk.Driver
		disk.Driver = &drv
	}
	disk.Driver.Type = "qcow2"
	disk.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: e.Overlay}}
	disk.BackingStore = &libvirtxml.DomainDiskBackingStore{
		Format: &libvirtxml.DomainDiskFormat{Type: e.BackingFormat},
		Source: e.Backing,
	}
	out, err := xml.Marshal(&disk)
	if err != nil {
		return nil, err
	}
	if len(dd.extra) > 0 {
		const end = "</disk>"
		if !bytes.HasSuffix(out, []byte(end)) {
			return nil, fmt.Errorf("unexpected disk rendering %q", out)
		}
		var buf bytes.Buffer
		buf.Write(out[:len(out)-len(end)])
		for _, x := range dd.extra {
			b, err := xml.Marshal(x)
			if err != nil {
				return nil, err
			}
			buf.Write(b)
		}
		buf.WriteString(end)
		out = buf.Bytes()
	}
	if err := checkNothingLost(dd.raw, out, e.DropSource); err != nil {
		return nil, err
	}
	return out, nil
}

// xmlText reports whether s survives XML: valid UTF-8 made of characters
// XML 1.0 allows.
func xmlText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
		case r < 0x20, r >= 0xd800 && r < 0xe000, r == 0xfffe, r == 0xffff:
			return false
		}
	}
	return true
}

// sourcePath is the file or block device a disk source names, or "" for
// any other kind of source.
func sourcePath(s *libvirtxml.DomainDiskSource) string {
	switch {
	case s == nil:
		return ""
	case s.File != nil:
		return s.File.File
	case s.Block != nil:
		return s.Block.Dev
	default:
		return ""
	}
}

// checkNothingLost compares an edited disk with the original and reports
// any element, attribute or text of the original missing from the edit,
// apart from what an overlay replaces on purpose: the disk's type, the
// driver's type, libvirt's runtime indexes and KubeVirt's name on a
// source. A first edit moves the source under the backing store, or drops
// it when dropSource says it only held the place of the backing; an edit
// of a disk already converted keeps it in place. libvirtxml drops what it
// does not know; this turns such a drop into an error.
func checkNothingLost(orig, edited []byte, dropSource bool) error {
	before, err := diskParts(orig)
	if err != nil {
		return err
	}
	after, err := diskParts(edited)
	if err != nil {
		return err
	}
	converted := before["disk/backingStore"] > 0
	var lost []string
	for part, n := range before {
		if dropSource && (part == "disk/source" || strings.HasPrefix(part, "disk/source@") || strings.HasPrefix(part, "disk/source/")) {
			continue
		}
		p, keep := overlayPart(part, converted)
		if keep && after[p] < n {
			lost = append(lost, part)
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		return fmt.Errorf("the overlay disk would lose %s", strings.Join(lost, ", "))
	}
	return nil
}

// overlayPart maps a part of the original disk to the part it becomes.
func overlayPart(part string, converted bool) (string, bool) {
	for _, replaced := range []string{"disk@type=", "disk/driver@type=", "disk/source@index=", "disk/source@name=",
		"disk/backingStore@index=", "disk/backingStore@type=", "disk/backingStore/source@index="} {
		if strings.HasPrefix(part, replaced) {
			return "", false
		}
	}
	if rest, ok := strings.CutPrefix(part, "disk/source"); ok && !converted {
		return "disk/backingStore/source" + rest, true
	}
	return part, true
}

// diskParts counts the element paths, attributes and texts of a disk
// element, e.g. "disk/driver", "disk/driver@cache=none", "disk/serial#abc".
func diskParts(raw []byte) (map[string]int, error) {
	parts := map[string]int{}
	d := xml.NewDecoder(bytes.NewReader(raw))
	var stack []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return parts, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parse disk: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			p := t.Name.Local
			if len(stack) > 0 {
				p = stack[len(stack)-1] + "/" + p
			}
			stack = append(stack, p)
			parts[p]++
			for _, a := range t.Attr {
				if a.Name.Space == "xmlns" || (a.Name.Space == "" && a.Name.Local == "xmlns") {
					continue
				}
				parts[p+"@"+a.Name.Local+"="+a.Value]++
			}
		case xml.CharData:
			if text := strings.TrimSpace(string(t)); text != "" && len(stack) > 0 {
				parts[stack[len(stack)-1]+"#"+text]++
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
}
