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

package backup_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/blockdev"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
)

// layerSpec is one layer of a chain made with qemu-img and qemu-io: its
// virtual size, its creation options and the qemu-io commands written to it.
type layerSpec struct {
	size     string
	options  string
	commands []string
}

func runTool(name string, args ...string) {
	GinkgoHelper()
	out, err := exec.Command(name, args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s %v: %s", name, args, out)
}

// sameBytes expects two files to hold the same bytes.
func sameBytes(got, want string) {
	GinkgoHelper()
	g, err := os.ReadFile(got)
	Expect(err).NotTo(HaveOccurred())
	w, err := os.ReadFile(want)
	Expect(err).NotTo(HaveOccurred())
	Expect(g).To(HaveLen(len(w)))
	Expect(bytes.Equal(g, w)).To(BeTrue(), "%s differs from %s", got, want)
}

var _ = Describe("a restore streamed into the target", func() {
	const bucket, prefix = "backups", "velero"
	var (
		ctx  context.Context
		repo *backup.Repository
		work string
	)
	BeforeEach(func(c SpecContext) {
		ctx = context.Background()
		work = GinkgoT().TempDir()
		srv := startS3(c)
		creds, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		repo = newRepository(ctx, srv.BSL(bucket, prefix), creds)
		repo.RetryDelay = 10 * time.Millisecond
	})

	// backUp makes the layers, each over the one before, uploads each as
	// a backup of vm (b0 full, the others incremental) and returns the
	// top layer, whose chain qemu-img reads through its backing files.
	backUp := func(vm catalog.VM, layers []layerSpec) string {
		GinkgoHelper()
		var prev string
		for i, l := range layers {
			file := filepath.Join(work, fmt.Sprintf("%s-%d.qcow2", vm.Name, i))
			args := []string{"create", "-q", "-f", "qcow2"}
			if l.options != "" {
				args = append(args, "-o", l.options)
			}
			spec := backup.CheckpointSpec{ID: fmt.Sprintf("cp%d", i), Type: catalog.Full, Backup: fmt.Sprintf("b%d", i)}
			if prev != "" {
				args = append(args, "-b", prev, "-F", "qcow2")
				spec.Type, spec.Parent = catalog.Incremental, fmt.Sprintf("cp%d", i-1)
			}
			runTool("qemu-img", append(args, file, l.size)...)
			for _, c := range l.commands {
				runTool("qemu-io", "-f", "qcow2", "-c", c, file)
			}
			up, err := repo.Begin(ctx, vm, spec)
			Expect(err).NotTo(HaveOccurred())
			_, err = up.PutDisk(ctx, "vda", file, nil)
			Expect(err).NotTo(HaveOccurred())
			_, err = up.Commit(ctx)
			Expect(err).NotTo(HaveOccurred())
			prev = file
		}
		return prev
	}

	restore := func(vm catalog.VM, b, target string) *backup.RestoreResult {
		GinkgoHelper()
		res, err := repo.Restore(ctx, backup.RestoreOptions{Backup: b, VM: vm, Disk: "vda", Target: target, WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		return res
	}

	DescribeTable("writes what qemu-img convert makes of the chain, onto a file and a block device, and so does the staged restore",
		func(layers []layerSpec) {
			vm := catalog.VM{Namespace: "prod", Name: "vm"}
			top := backUp(vm, layers)
			b := fmt.Sprintf("b%d", len(layers)-1)
			want := filepath.Join(work, "want.raw")
			runTool("qemu-img", "convert", "-f", "qcow2", "-O", "raw", top, want)
			st, err := os.Stat(want)
			Expect(err).NotTo(HaveOccurred())

			// A file that was there is replaced.
			target := filepath.Join(work, "restored.raw")
			Expect(os.WriteFile(target, bytes.Repeat([]byte{0xee}, int(st.Size())+3<<20), 0o600)).To(Succeed())
			res := restore(vm, b, target)
			Expect(res.VirtualSize).To(Equal(st.Size()))
			sameBytes(target, want)

			// A block device larger than the disk is written in place;
			// past the disk it keeps what it held.
			backing := filepath.Join(work, "device.img")
			Expect(os.WriteFile(backing, bytes.Repeat([]byte{0xee}, int(st.Size())+1<<20), 0o600)).To(Succeed())
			dev, err := blockdev.AttachLoop(backing, false)
			Expect(err).NotTo(HaveOccurred())
			restore(vm, b, dev)
			Expect(blockdev.DetachLoop(dev)).To(Succeed())
			Expect(os.Truncate(backing, st.Size())).To(Succeed())
			sameBytes(backing, want)

			// The staged restore, for chains whose map is too large.
			repo.MaxRestoreExtents = 4
			staged := filepath.Join(work, "staged.raw")
			restore(vm, b, staged)
			sameBytes(staged, want)
		},
		Entry("a full disk alone", []layerSpec{
			{size: "64M", commands: []string{"write -P 0x11 0 8M", "write -z 16M 1M", "write -P 0x12 33M 64k"}},
		}),
		Entry("overlapping writes, zeroes and discards over four layers", []layerSpec{
			{size: "64M", commands: []string{"write -P 0x11 0 32M", "write -P 0x12 40M 3M"}},
			{size: "64M", commands: []string{"write -P 0x22 4M 2M", "write -z 10M 1M", "discard 20M 2M", "write -P 0x23 41M 4k"}},
			{size: "64M", commands: []string{"write -P 0x33 5M 64k", "write -P 0x34 10M 512k", "write -z 0 64k", "discard 40M 1M"}},
			{size: "64M", commands: []string{"discard 4M 1M", "write -P 0x44 31M 2M", "write -P 0x45 63M 1M"}},
		}),
		Entry("a disk whose size is no multiple of the cluster size", []layerSpec{
			{size: "67109376", commands: []string{"write -P 0x11 0 1M", "write -P 0x12 64M 512"}},
			{size: "67109376", commands: []string{"write -P 0x21 67104768 4608"}},
		}),
		Entry("small clusters over many L2 tables", []layerSpec{
			{size: "64M", options: "cluster_size=4k", commands: []string{"write -P 0x11 0 16M", "write -P 0x12 30M 5M"}},
			{size: "64M", options: "cluster_size=4k", commands: []string{"write -P 0x21 1M 3k", "write -z 2M 1M", "discard 31M 64k"}},
		}),
		Entry("a disk shrunk, then grown", []layerSpec{
			{size: "64M", commands: []string{"write -P 0x11 0 64M"}},
			{size: "32M", commands: []string{"write -P 0x21 16M 1M"}},
			{size: "64M", commands: []string{"write -P 0x31 48M 1M"}},
		}),
		Entry("a version 2 chain", []layerSpec{
			{size: "64M", options: "compat=0.10", commands: []string{"write -P 0x11 0 4M"}},
			{size: "64M", options: "compat=0.10", commands: []string{"write -P 0x21 1M 64k", "write -z 2M 64k"}},
		}),
	)
})
