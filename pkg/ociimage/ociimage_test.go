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

package ociimage_test

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

func TestOCIImage(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "ociimage Suite")
}

var _ = Describe("Build", func() {
	var (
		dir  string
		bin  string
		spec ociimage.Spec
	)

	BeforeEach(func() {
		dir = GinkgoT().TempDir()
		bin = filepath.Join(dir, "hook")
		Expect(os.WriteFile(bin, []byte("\x7fELF a static binary"), 0o700)).To(Succeed())
		spec = ociimage.Spec{
			Files:      []ociimage.File{{Path: "/usr/bin/overlay-hook", Source: bin, Mode: 0o755}},
			Entrypoint: []string{"/usr/bin/overlay-hook"},
			Labels:     map[string]string{"org.opencontainers.image.title": "overlay-hook"},
		}
	})

	It("builds the same digest from the same files, whatever their timestamps", func(ctx SpecContext) {
		a, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		Expect(os.Chtimes(bin, time.Now(), time.Now().Add(-time.Hour))).To(Succeed())
		b, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		da, err := a.Digest()
		Expect(err).ToNot(HaveOccurred())
		db, err := b.Digest()
		Expect(err).ToNot(HaveOccurred())
		Expect(da).To(Equal(db))

		Expect(os.WriteFile(bin, []byte("\x7fELF another binary"), 0o700)).To(Succeed())
		c, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		dc, err := c.Digest()
		Expect(err).ToNot(HaveOccurred())
		Expect(dc).ToNot(Equal(da))
	})

	It("holds the files with their parents, owned by root, and the config", func(ctx SpecContext) {
		img, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		mt, err := img.MediaType()
		Expect(err).ToNot(HaveOccurred())
		Expect(mt).To(Equal(types.OCIManifestSchema1))

		cfg, err := img.ConfigFile()
		Expect(err).ToNot(HaveOccurred())
		Expect(cfg.Config.Entrypoint).To(Equal([]string{"/usr/bin/overlay-hook"}))
		Expect(cfg.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.title", "overlay-hook"))
		Expect(cfg.OS).To(Equal("linux"))
		Expect(cfg.Architecture).To(Equal("amd64"))
		Expect(cfg.Created.Unix()).To(BeZero())

		layers, err := img.Layers()
		Expect(err).ToNot(HaveOccurred())
		Expect(layers).To(HaveLen(1))
		lmt, err := layers[0].MediaType()
		Expect(err).ToNot(HaveOccurred())
		Expect(lmt).To(Equal(types.OCILayer))

		rc, err := layers[0].Uncompressed()
		Expect(err).ToNot(HaveOccurred())
		defer rc.Close()
		tr := tar.NewReader(rc)
		var names []string
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			Expect(err).ToNot(HaveOccurred())
			names = append(names, hdr.Name)
			Expect(hdr.Uid).To(BeZero())
			Expect(hdr.ModTime.Unix()).To(BeZero())
			if hdr.Name == "usr/bin/overlay-hook" {
				Expect(hdr.Mode).To(Equal(int64(0o755)))
				data, err := io.ReadAll(tr)
				Expect(err).ToNot(HaveOccurred())
				Expect(string(data)).To(Equal("\x7fELF a static binary"))
			}
		}
		Expect(names).To(Equal([]string{"usr/", "usr/bin/", "usr/bin/overlay-hook"}))
	})

	It("writes an OCI layout that reads back with the tag", func(ctx SpecContext) {
		img, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		out := filepath.Join(dir, "layout")
		digest, err := ociimage.WriteLayout(ctx, out, "kubevirt-qcow2/overlay-hook:dev", img)
		Expect(err).ToNot(HaveOccurred())
		Expect(filepath.Join(out, "oci-layout")).To(BeAnExistingFile())

		// Writing again replaces the layout with an identical one.
		digest2, err := ociimage.WriteLayout(ctx, out, "kubevirt-qcow2/overlay-hook:dev", img)
		Expect(err).ToNot(HaveOccurred())
		Expect(digest2).To(Equal(digest))

		idx, err := layout.ImageIndexFromPath(out)
		Expect(err).ToNot(HaveOccurred())
		m, err := idx.IndexManifest()
		Expect(err).ToNot(HaveOccurred())
		Expect(m.Manifests).To(HaveLen(1))
		Expect(m.Manifests[0].Digest).To(Equal(digest))
		Expect(m.Manifests[0].Annotations).To(HaveKeyWithValue("org.opencontainers.image.ref.name", "kubevirt-qcow2/overlay-hook:dev"))
		back, err := idx.Image(digest)
		Expect(err).ToNot(HaveOccurred())
		layers, err := back.Layers()
		Expect(err).ToNot(HaveOccurred())
		Expect(layers).To(HaveLen(1))
	})

	DescribeTable("refuses bad file lists",
		func(ctx SpecContext, files []ociimage.File, message string) {
			_, err := ociimage.Build(ctx, ociimage.Spec{Files: files})
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("a relative path", []ociimage.File{{Path: "bin/x", Source: "/dev/null"}}, `"bin/x" is not a clean absolute file path`),
		Entry("an unclean path", []ociimage.File{{Path: "/bin/../x", Source: "/dev/null"}}, "not a clean absolute"),
		Entry("a path twice", []ociimage.File{{Path: "/x", Source: "/dev/null"}, {Path: "/x", Source: "/dev/null"}}, "given twice"),
		Entry("a file used as a directory", []ociimage.File{{Path: "/x", Source: "/dev/null"}, {Path: "/x/y", Source: "/dev/null"}}, "both a file and a directory"),
		Entry("a missing source", []ociimage.File{{Path: "/x", Source: "/nonexistent/file"}}, "image file /x"),
	)
})

var _ = Describe("Build with a tree", func() {
	It("makes the tree one root-owned layer under the files, modes and links kept", func(ctx SpecContext) {
		tree := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(tree, "usr/bin"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(tree, "usr/bin/tool"), []byte("tool"), 0o755)).To(Succeed())
		Expect(os.Chmod(filepath.Join(tree, "usr/bin/tool"), 0o755|os.ModeSetuid)).To(Succeed())
		Expect(os.Symlink("usr/bin", filepath.Join(tree, "bin"))).To(Succeed())
		bin := filepath.Join(GinkgoT().TempDir(), "extra")
		Expect(os.WriteFile(bin, []byte("extra"), 0o600)).To(Succeed())

		img, err := ociimage.Build(ctx, ociimage.Spec{Tree: tree, Files: []ociimage.File{{Path: "/usr/bin/extra", Source: bin, Mode: 0o555}}})
		Expect(err).ToNot(HaveOccurred())
		layers, err := img.Layers()
		Expect(err).ToNot(HaveOccurred())
		Expect(layers).To(HaveLen(2))
		files := flattened(img)
		Expect(files["usr/bin/tool"].Mode).To(Equal(int64(0o4755)))
		Expect(files["usr/bin/tool"].Uid).To(BeZero())
		Expect(files["bin"].Typeflag).To(Equal(byte(tar.TypeSymlink)))
		Expect(files["bin"].Linkname).To(Equal("usr/bin"))
		Expect(files["usr/bin/extra"].Mode).To(Equal(int64(0o555)))

		// The same tree with other timestamps gives the same image.
		Expect(os.Chtimes(filepath.Join(tree, "usr/bin/tool"), time.Now(), time.Now().Add(-time.Hour))).To(Succeed())
		again, err := ociimage.Build(ctx, ociimage.Spec{Tree: tree, Files: []ociimage.File{{Path: "/usr/bin/extra", Source: bin, Mode: 0o555}}})
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(again)).To(Equal(digestOf(img)))
	})

	It("gives a file the capabilities asked for, as the kernel reads them", func(ctx SpecContext) {
		bin := filepath.Join(GinkgoT().TempDir(), "monitor")
		Expect(os.WriteFile(bin, []byte("monitor"), 0o755)).To(Succeed())
		img, err := ociimage.Build(ctx, ociimage.Spec{Files: []ociimage.File{
			{Path: "/usr/bin/monitor", Source: bin, Mode: 0o555, Capabilities: []int{10}},
		}})
		Expect(err).ToNot(HaveOccurred())
		rc := mutate.Extract(img)
		defer rc.Close()
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			Expect(err).ToNot(HaveOccurred(), "no usr/bin/monitor in the image")
			if h.Name != "usr/bin/monitor" {
				continue
			}
			// vfs_cap_data revision 2 with the effective flag; permitted
			// holds bit 10 (CAP_NET_BIND_SERVICE); inheritable empty.
			Expect([]byte(h.PAXRecords["SCHILY.xattr.security.capability"])).To(Equal([]byte{
				0x01, 0, 0, 0x02, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}))
			return
		}
	})

	It("refuses a special file in the tree, naming it", func(ctx SpecContext) {
		tree := GinkgoT().TempDir()
		Expect(syscall.Mkfifo(filepath.Join(tree, "fifo"), 0o644)).To(Succeed())
		_, err := ociimage.Build(ctx, ociimage.Spec{Tree: tree})
		Expect(err).To(MatchError(ContainSubstring("fifo is p")))
	})
})
