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
	"reflect"
	"sort"
	"testing"
)

// FuzzParseConfig: any annotation text either fails to parse or yields a
// valid configuration that survives a round trip. Never a panic.
func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		`{"disks":[{"name":"rootdisk"}]}`,
		`{"disks":[{"name":"rootdisk","persistent":true,"path":"a/b.qcow2","size":"20Gi","backingFormat":"qcow2"}],"identity":"sha256","create":{"clusterSize":"64Ki","extendedL2":true,"lazyRefcounts":true}}`,
		`{"disks":[]}`,
		`{"disks":[{"name":"a","size":1073741824}]}`,
		`{"disks":null}`,
		`[]`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := ParseConfig(text)
		if err != nil {
			if cfg != nil {
				t.Fatalf("error %v with a configuration", err)
			}
			return
		}
		names := map[string]bool{}
		for _, d := range cfg.Disks {
			if d.Name == "" || names[d.Name] {
				t.Fatalf("accepted disk name %q twice or empty", d.Name)
			}
			names[d.Name] = true
			if d.Path != "" && (!d.Persistent || checkRelativePath(d.Path) != nil) {
				t.Fatalf("accepted path %q", d.Path)
			}
			if d.Size < 0 {
				t.Fatalf("accepted size %d", d.Size)
			}
		}
		text2, err := cfg.Marshal()
		if err != nil {
			t.Fatalf("marshal %+v: %v", cfg, err)
		}
		cfg2, err := ParseConfig(text2)
		if err != nil {
			t.Fatalf("reparse %q: %v", text2, err)
		}
		if !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("round trip changed %+v into %+v", cfg, cfg2)
		}
	})
}

// FuzzEditDomain: for any document, scanning either fails or finds disks;
// turning every plain file or block disk into an overlay either fails or
// yields a document whose other bytes are unchanged, whose edited disks
// lost nothing, and which scans to the same disks with the overlays in
// place. Never a panic.
func FuzzEditDomain(f *testing.F) {
	f.Add([]byte(`<domain type="kvm"><devices><disk type="file" device="disk"><driver name="qemu" type="raw"/>`+
		`<source file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"/><target bus="virtio" dev="vda"/>`+
		`<alias name="ua-rootdisk"/><capacity>1024</capacity></disk></devices></domain>`), "/o/system.qcow2")
	f.Add([]byte(`<domain><devices><disk type="block"><source dev="/dev/rootdisk" name="rootdisk"/><alias name="ua-b"/></disk>`+
		`<disk type="file"><alias name="ua-c"/><source file="/c"/><backingStore type="file"><format type="raw"/>`+
		`<source file="/g"/></backingStore></disk></devices></domain>`), "/o/b.qcow2")
	f.Fuzz(func(t *testing.T, doc []byte, overlay string) {
		disks, err := scanDisks(doc)
		if err != nil {
			return
		}
		var edits []diskEdit
		var names []string
		for name, dd := range disks {
			names = append(names, name)
			if sourcePath(dd.disk.Source) == "" || dd.disk.BackingStore != nil {
				continue
			}
			edits = append(edits, diskEdit{Name: name, Overlay: "/" + overlay + name, Backing: dd.disk.Source, BackingFormat: "raw"})
		}
		sort.Strings(names)
		out, err := editDomain(doc, disks, edits)
		if err != nil {
			return
		}
		again, err := scanDisks(out)
		if err != nil {
			t.Fatalf("edited document does not scan: %v\n%s", err, out)
		}
		var names2 []string
		for name := range again {
			names2 = append(names2, name)
		}
		sort.Strings(names2)
		if !reflect.DeepEqual(names, names2) {
			t.Fatalf("disks %v became %v", names, names2)
		}
		edited := map[string]bool{}
		for _, e := range edits {
			edited[e.Name] = true
			dd := again[e.Name]
			if sourcePath(dd.disk.Source) != e.Overlay || dd.disk.Driver == nil || dd.disk.Driver.Type != "qcow2" ||
				dd.disk.BackingStore == nil || sourcePath(dd.disk.BackingStore.Source) != sourcePath(e.Backing) {
				t.Fatalf("disk %s was not turned into an overlay: %s", e.Name, out[dd.start:dd.end])
			}
			if err := checkNothingLost(disks[e.Name].raw, out[dd.start:dd.end], false); err != nil {
				t.Fatalf("disk %s: %v", e.Name, err)
			}
		}
		// Outside the edited disks, the bytes are the original's.
		if !bytes.Equal(outside(doc, disks, edited), outside(out, again, edited)) {
			t.Fatalf("bytes outside the edited disks changed")
		}
	})
}

// outside returns doc without the edited disks, in document order.
func outside(doc []byte, disks map[string]*domainDisk, edited map[string]bool) []byte {
	var spans []*domainDisk
	for name, dd := range disks {
		if edited[name] {
			spans = append(spans, dd)
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	var rest []byte
	pos := int64(0)
	for _, dd := range spans {
		rest = append(rest, doc[pos:dd.start]...)
		rest = append(rest, 0) // a marker where a disk was
		pos = dd.end
	}
	return append(rest, doc[pos:]...)
}
