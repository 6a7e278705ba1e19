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
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

// tarEntry is one entry of a synthetic base layer.
type tarEntry struct {
	name, data, link string
	typ              byte
	mode             int64
	uid, gid         int
}

var baseTime = time.Date(2025, 11, 5, 10, 0, 0, 0, time.UTC)

func layerOf(mt types.MediaType, entries ...tarEntry) v1.Layer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		Expect(tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Size: int64(len(e.data)), Linkname: e.link, ModTime: baseTime})).To(Succeed())
		_, err := tw.Write([]byte(e.data))
		Expect(err).ToNot(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(mt))
	Expect(err).ToNot(HaveOccurred())
	return layer
}

// syntheticBase stands in for an upstream KubeVirt image: two layers (the
// second deletes a file of the first), a non-root user, an entrypoint,
// environment and labels, in Docker's or OCI's format.
func syntheticBase(manifest types.MediaType) v1.Image {
	layerType, configType := types.OCILayer, types.OCIConfigJSON
	if manifest == types.DockerManifestSchema2 {
		layerType, configType = types.DockerLayer, types.DockerConfigJSON
	}
	img := mutate.MediaType(empty.Image, manifest)
	img = mutate.ConfigMediaType(img, configType)
	img, err := mutate.Append(img,
		mutate.Addendum{MediaType: layerType, Layer: layerOf(layerType,
			tarEntry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "etc/passwd", mode: 0o644, data: "root:x:0:0::/root:/bin/sh\nqemu:x:107:107::/:/sbin/nologin\n"},
			tarEntry{name: "lib", typ: tar.TypeSymlink, link: "usr/lib", mode: 0o777},
			tarEntry{name: "usr/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "usr/bin/", typ: tar.TypeDir, mode: 0o711, gid: 10},
			tarEntry{name: "usr/bin/virt-launcher", mode: 0o555, data: "upstream launcher"},
			tarEntry{name: "usr/bin/dropped", mode: 0o555, data: "deleted by the next layer"},
			tarEntry{name: "usr/lib/", typ: tar.TypeDir, mode: 0o755},
			tarEntry{name: "usr/share/", typ: tar.TypeDir, mode: 0o755},
		)},
		mutate.Addendum{MediaType: layerType, Layer: layerOf(layerType,
			tarEntry{name: "usr/bin/.wh.dropped", mode: 0o644},
			tarEntry{name: "usr/bin/virt-tail", mode: 0o555, data: "upstream tail"},
		)},
	)
	Expect(err).ToNot(HaveOccurred())
	cfg, err := img.ConfigFile()
	Expect(err).ToNot(HaveOccurred())
	cfg = cfg.DeepCopy()
	cfg.Created = v1.Time{Time: baseTime}
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/virt-launcher"},
		Cmd:        []string{"--help"},
		Env:        []string{"PATH=/usr/bin:/bin", "LIBVIRT_DEBUG=0"},
		User:       "107",
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.source": "upstream", "release": "v1.7.0"},
	}
	img, err = mutate.ConfigFile(img, cfg)
	Expect(err).ToNot(HaveOccurred())
	return img
}

// flattened is the image's file system as a runtime unpacks it.
func flattened(img v1.Image) map[string]*tar.Header {
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		Expect(err).ToNot(HaveOccurred())
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			Expect(err).ToNot(HaveOccurred())
			h.PAXRecords = map[string]string{"data": string(data)}
		}
		out[h.Name] = h
	}
}

func digestOf(img v1.Image) v1.Hash {
	d, err := img.Digest()
	Expect(err).ToNot(HaveOccurred())
	return d
}

func layerDigests(img v1.Image) []v1.Hash {
	layers, err := img.Layers()
	Expect(err).ToNot(HaveOccurred())
	var out []v1.Hash
	for _, l := range layers {
		d, err := l.Digest()
		Expect(err).ToNot(HaveOccurred())
		out = append(out, d)
	}
	return out
}

var _ = Describe("Build onto a base image", func() {
	var (
		dir, launcher string
		base          v1.Image
		spec          ociimage.Spec
	)

	BeforeEach(func() {
		dir = GinkgoT().TempDir()
		launcher = filepath.Join(dir, "virt-launcher")
		Expect(os.WriteFile(launcher, []byte("\x7fELF patched launcher"), 0o700)).To(Succeed())
		base = syntheticBase(types.OCIManifestSchema1)
		spec = ociimage.Spec{Base: base, Files: []ociimage.File{
			{Path: "/usr/bin/virt-launcher", Source: launcher, Mode: 0o555},
		}}
	})

	DescribeTable("keeps the base's layers, format and config and adds one layer",
		func(ctx SpecContext, manifest, layer types.MediaType) {
			base = syntheticBase(manifest)
			spec.Base = base
			img, err := ociimage.Build(ctx, spec)
			Expect(err).ToNot(HaveOccurred())

			mt, err := img.MediaType()
			Expect(err).ToNot(HaveOccurred())
			Expect(mt).To(Equal(manifest))
			baseLayers, layers := layerDigests(base), layerDigests(img)
			Expect(layers).To(HaveLen(len(baseLayers) + 1))
			Expect(layers[:len(baseLayers)]).To(Equal(baseLayers))
			top, err := img.LayerByDigest(layers[len(layers)-1])
			Expect(err).ToNot(HaveOccurred())
			Expect(top.MediaType()).To(Equal(layer))

			baseCfg, err := base.ConfigFile()
			Expect(err).ToNot(HaveOccurred())
			cfg, err := img.ConfigFile()
			Expect(err).ToNot(HaveOccurred())
			Expect(cfg.Config).To(Equal(baseCfg.Config))
			Expect(cfg.OS).To(Equal("linux"))
			Expect(cfg.Architecture).To(Equal("amd64"))
			Expect(cfg.Created.Time).To(BeTemporally("==", baseTime), "the base's creation time, for reproducibility")
			Expect(cfg.RootFS.DiffIDs[:len(baseLayers)]).To(Equal(baseCfg.RootFS.DiffIDs))
			Expect(cfg.History).To(HaveLen(len(baseCfg.History) + 1))
		},
		Entry("OCI base", types.OCIManifestSchema1, types.OCILayer),
		Entry("Docker base", types.DockerManifestSchema2, types.DockerLayer),
	)

	It("puts the file at its path with its mode and owner, over the base's, with no whiteout", func(ctx SpecContext) {
		helper := filepath.Join(dir, "helper")
		Expect(os.WriteFile(helper, []byte("owned by qemu"), 0o600)).To(Succeed())
		spec.Files = append(spec.Files, ociimage.File{Path: "/usr/share/kubevirt/helper", Source: helper, Mode: 0o750, UID: 107, GID: 107})
		img, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())

		fs := flattened(img)
		Expect(fs).To(HaveKey("usr/bin/virt-launcher"))
		l := fs["usr/bin/virt-launcher"]
		Expect(l.Typeflag).To(Equal(byte(tar.TypeReg)))
		Expect(l.PAXRecords["data"]).To(Equal("\x7fELF patched launcher"))
		Expect(l.Mode).To(Equal(int64(0o555)))
		Expect([]int{l.Uid, l.Gid}).To(Equal([]int{0, 0}))
		h := fs["usr/share/kubevirt/helper"]
		Expect(h).ToNot(BeNil())
		Expect(h.Mode).To(Equal(int64(0o750)))
		Expect([]int{h.Uid, h.Gid}).To(Equal([]int{107, 107}))
		// The rest of the base is as it was.
		Expect(fs["usr/bin/virt-tail"].PAXRecords["data"]).To(Equal("upstream tail"))
		Expect(fs).ToNot(HaveKey("usr/bin/dropped"))
		Expect(fs["lib"].Typeflag).To(Equal(byte(tar.TypeSymlink)))

		// The new layer: the files and their parents, the base's parents
		// with the base's owner, mode and time; nothing whited out.
		layers, err := img.Layers()
		Expect(err).ToNot(HaveOccurred())
		rc, err := layers[len(layers)-1].Uncompressed()
		Expect(err).ToNot(HaveOccurred())
		defer rc.Close()
		tr := tar.NewReader(rc)
		got := map[string]*tar.Header{}
		var names []string
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			Expect(err).ToNot(HaveOccurred())
			names = append(names, hdr.Name)
			got[hdr.Name] = hdr
		}
		Expect(names).To(Equal([]string{"usr/", "usr/bin/", "usr/bin/virt-launcher", "usr/share/", "usr/share/kubevirt/", "usr/share/kubevirt/helper"}))
		Expect(got["usr/bin/"].Mode).To(Equal(int64(0o711)))
		Expect(got["usr/bin/"].Gid).To(Equal(10))
		Expect(got["usr/bin/"].ModTime).To(BeTemporally("==", baseTime))
		Expect(got["usr/share/kubevirt/"].Mode).To(Equal(int64(0o755)))
	})

	It("adds back a path the base deleted", func(ctx SpecContext) {
		spec.Files = []ociimage.File{{Path: "/usr/bin/dropped", Source: launcher, Mode: 0o500}}
		img, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		fs := flattened(img)
		Expect(fs).To(HaveKey("usr/bin/dropped"))
		Expect(fs["usr/bin/dropped"].PAXRecords["data"]).To(Equal("\x7fELF patched launcher"))
		Expect(fs["usr/bin/dropped"].Mode).To(Equal(int64(0o500)))
	})

	It("overrides settings only where asked, merging environment and labels", func(ctx SpecContext) {
		spec.User = "0"
		spec.Env = []string{"LIBVIRT_DEBUG=1", "QCOW2=on"}
		spec.Labels = map[string]string{"release": "v1.7.0-qcow2"}
		img, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		cfg, err := img.ConfigFile()
		Expect(err).ToNot(HaveOccurred())
		Expect(cfg.Config.Entrypoint).To(Equal([]string{"/usr/bin/virt-launcher"}))
		Expect(cfg.Config.User).To(Equal("0"))
		Expect(cfg.Config.Env).To(Equal([]string{"PATH=/usr/bin:/bin", "LIBVIRT_DEBUG=1", "QCOW2=on"}))
		Expect(cfg.Config.Labels).To(Equal(map[string]string{"org.opencontainers.image.source": "upstream", "release": "v1.7.0-qcow2"}))
	})

	It("gives the same digest for the same inputs and another for another binary or base", func(ctx SpecContext) {
		a, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		Expect(os.Chtimes(launcher, time.Now(), time.Now().Add(-time.Hour))).To(Succeed())
		spec.Base = syntheticBase(types.OCIManifestSchema1)
		b, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(b)).To(Equal(digestOf(a)))

		Expect(os.WriteFile(launcher, []byte("\x7fELF patched launcher, rebuilt"), 0o700)).To(Succeed())
		c, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(c)).ToNot(Equal(digestOf(a)))

		spec.Base = syntheticBase(types.DockerManifestSchema2)
		d, err := ociimage.Build(ctx, spec)
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(d)).ToNot(Equal(digestOf(c)))
	})

	DescribeTable("refuses to write over what is not a regular file in the base",
		func(ctx SpecContext, path, message string) {
			spec.Files = []ociimage.File{{Path: path, Source: launcher}}
			_, err := ociimage.Build(ctx, spec)
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("a directory", "/usr/bin", "image path /usr/bin is a directory in the base image"),
		Entry("a symbolic link", "/lib", "image path /lib is a symbolic link to usr/lib in the base image"),
		Entry("below a symbolic link", "/lib/x86_64-linux-gnu/libz.so.1", "parent /lib is a symbolic link to usr/lib in the base image"),
		Entry("below a file", "/etc/passwd/x", "parent /etc/passwd is a regular file"),
	)
})

var _ = Describe("Load, WriteArchive and Push", func() {
	var base v1.Image

	BeforeEach(func() {
		base = syntheticBase(types.DockerManifestSchema2)
	})

	It("reads a base back from an OCI layout and a docker archive", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		want := digestOf(base)
		_, err := ociimage.WriteLayout(ctx, filepath.Join(dir, "layout"), "upstream/virt-launcher:v1.7.0", base)
		Expect(err).ToNot(HaveOccurred())
		Expect(ociimage.WriteArchive(ctx, filepath.Join(dir, "base.tar"), "upstream/virt-launcher:v1.7.0", base)).To(Succeed())

		for _, source := range []string{"oci:" + filepath.Join(dir, "layout"), "docker-archive:" + filepath.Join(dir, "base.tar")} {
			img, err := ociimage.Load(ctx, source, ociimage.DefaultPlatform)
			Expect(err).ToNot(HaveOccurred(), source)
			Expect(digestOf(img)).To(Equal(want), source)
		}
		_, err = ociimage.Load(ctx, "oci:"+filepath.Join(dir, "missing"), ociimage.DefaultPlatform)
		Expect(err).To(MatchError(ContainSubstring("load image oci:" + filepath.Join(dir, "missing"))))
	})

	It("pushes a layout to a registry and layers onto the pulled image", func(ctx SpecContext) {
		srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		DeferCleanup(srv.Close)
		u, err := url.Parse(srv.URL)
		Expect(err).ToNot(HaveOccurred())
		dir := GinkgoT().TempDir()
		_, err = ociimage.WriteLayout(ctx, filepath.Join(dir, "base"), "", base)
		Expect(err).ToNot(HaveOccurred())
		ref := u.Host + "/kubevirt/virt-launcher:v1.7.0"
		pushed, err := ociimage.Push(ctx, filepath.Join(dir, "base"), ref)
		Expect(err).ToNot(HaveOccurred())
		Expect(pushed).To(Equal(digestOf(base)))

		pulled, err := ociimage.Load(ctx, ref, ociimage.DefaultPlatform)
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(pulled)).To(Equal(digestOf(base)))
		bin := filepath.Join(dir, "virt-launcher")
		Expect(os.WriteFile(bin, []byte("patched"), 0o755)).To(Succeed())
		fromRegistry, err := ociimage.Build(ctx, ociimage.Spec{Base: pulled, Files: []ociimage.File{{Path: "/usr/bin/virt-launcher", Source: bin, Mode: 0o555}}})
		Expect(err).ToNot(HaveOccurred())
		fromMemory, err := ociimage.Build(ctx, ociimage.Spec{Base: base, Files: []ociimage.File{{Path: "/usr/bin/virt-launcher", Source: bin, Mode: 0o555}}})
		Expect(err).ToNot(HaveOccurred())
		Expect(digestOf(fromRegistry)).To(Equal(digestOf(fromMemory)))
	})
})
