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
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("ParseConfig", func() {
	DescribeTable("accepts",
		func(text string, want Config) {
			cfg, err := ParseConfig(text)
			Expect(err).ToNot(HaveOccurred())
			Expect(*cfg).To(Equal(want))

			// What it accepts survives a round trip.
			again, err := cfg.Marshal()
			Expect(err).ToNot(HaveOccurred())
			cfg2, err := ParseConfig(again)
			Expect(err).ToNot(HaveOccurred())
			Expect(cfg2).To(Equal(cfg))
		},
		Entry("one ephemeral disk", `{"disks":[{"name":"rootdisk"}]}`,
			Config{Disks: []DiskConfig{{Name: "rootdisk"}}}),
		Entry("nothing to do", `{"disks":[]}`, Config{Disks: []DiskConfig{}}),
		Entry("everything",
			`{"disks":[{"name":"rootdisk","backingFormat":"qcow2","persistent":true,"path":"vms/vm1/system.qcow2","size":"20Gi"},`+
				`{"name":"data","size":1048576}],"identity":"sha256",`+
				`"create":{"clusterSize":"128Ki","extendedL2":true,"lazyRefcounts":true}}`,
			Config{
				Disks: []DiskConfig{
					{Name: "rootdisk", BackingFormat: "qcow2", Persistent: true, Path: "vms/vm1/system.qcow2", Size: 20 << 30},
					{Name: "data", Size: 1 << 20},
				},
				Identity: "sha256",
				Create:   CreateConfig{ClusterSize: 128 << 10, ExtendedL2: true, LazyRefcounts: true},
			}),
		Entry("a size in bytes as a string", `{"disks":[{"name":"a","size":"4096"}]}`,
			Config{Disks: []DiskConfig{{Name: "a", Size: 4096}}}),
		Entry("a backing on the sidecar's claim", `{"disks":[{"name":"a","backing":"golden/disk.img","backingFormat":"qcow2"}]}`,
			Config{Disks: []DiskConfig{{Name: "a", Backing: "golden/disk.img", BackingFormat: "qcow2"}}}),
	)

	DescribeTable("refuses, naming the problem",
		func(text, message string) {
			_, err := ParseConfig(text)
			Expect(err).To(MatchError(ContainSubstring(AnnotationKey)))
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("not JSON", `disks: [rootdisk]`, "invalid character"),
		Entry("empty", ``, "EOF"),
		Entry("a list", `[{"name":"rootdisk"}]`, "cannot unmarshal array"),
		Entry("no disks", `{}`, `"disks" is missing`),
		Entry("a misspelt field", `{"disks":[{"name":"a","persistant":true}]}`, `unknown field "persistant"`), //nolint:misspell // the misspelling is the input under test
		Entry("trailing data", `{"disks":[]} {}`, "trailing data"),
		Entry("a disk without name", `{"disks":[{"persistent":true}]}`, "disks[0].name is empty"),
		Entry("a disk twice", `{"disks":[{"name":"a"},{"name":"a"}]}`, `disks[1].name: disk "a" is listed twice`),
		Entry("an unknown format", `{"disks":[{"name":"a","backingFormat":"vmdk"}]}`, `disks[0].backingFormat: "vmdk" is not raw or qcow2`),
		Entry("a path for an ephemeral overlay", `{"disks":[{"name":"a","path":"a.qcow2"}]}`, "only persistent overlays have a path"),
		Entry("an absolute path", `{"disks":[{"name":"a","persistent":true,"path":"/a.qcow2"}]}`, "is absolute"),
		Entry("a path leaving the PVC", `{"disks":[{"name":"a","persistent":true,"path":"../a.qcow2"}]}`, "leaves the overlay PVC"),
		Entry("an unclean path", `{"disks":[{"name":"a","persistent":true,"path":"x/../../a"}]}`, "is not a clean path"),
		Entry("a record's name", `{"disks":[{"name":"a","persistent":true,"path":"a.overlay.json"}]}`, "ends like an overlay record"),
		Entry("a control character in a path", `{"disks":[{"name":"a","persistent":true,"path":"a\u0001b"}]}`, "characters a domain XML cannot carry"),
		Entry("one path for two disks", `{"disks":[{"name":"a","persistent":true,"path":"x"},{"name":"b","persistent":true,"path":"x"}]}`, `is also the path of disk "a"`),
		Entry("an absolute backing", `{"disks":[{"name":"a","backing":"/disk.img"}]}`, "disks[0].backing: \"/disk.img\" is absolute"),
		Entry("a backing leaving the PVC", `{"disks":[{"name":"a","backing":"../disk.img"}]}`, "disks[0].backing: \"../disk.img\" leaves the overlay PVC"),
		Entry("a backing that is an overlay", `{"disks":[{"name":"a","backing":"x"},{"name":"b","persistent":true,"path":"x"}]}`,
			`disks[0].backing: "x" is the overlay path of disk "b"`),
		Entry("a negative size", `{"disks":[{"name":"a","size":-1}]}`, `invalid size "-1"`),
		Entry("a size with a decimal suffix", `{"disks":[{"name":"a","size":"20G"}]}`, `invalid size "20G"`),
		Entry("a size too large", `{"disks":[{"name":"a","size":"99999999Pi"}]}`, "invalid size"),
		Entry("a size of another type", `{"disks":[{"name":"a","size":true}]}`, "neither a byte count"),
		Entry("an unknown identity", `{"disks":[],"identity":"md5"}`, `identity: "md5"`),
		Entry("an odd cluster size", `{"disks":[],"create":{"clusterSize":3000}}`, "create.clusterSize: 3000"),
		Entry("extended L2 with small clusters", `{"disks":[],"create":{"clusterSize":"4Ki","extendedL2":true}}`, "at least 16Ki"),
	)
})
