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
	"context"
	"crypto/rand"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

// cancelingLayer ends a context once its content is first read.
type cancelingLayer struct {
	v1.Layer
	cancel context.CancelFunc
}

func (l cancelingLayer) Compressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Compressed()
	return cancelingReader{ReadCloser: rc, cancel: l.cancel}, err
}

type cancelingReader struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (r cancelingReader) Read(p []byte) (int, error) {
	r.cancel()
	return r.ReadCloser.Read(p)
}

var _ = Describe("Cancellation", func() {
	It("starts nothing once the context has ended", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		base := syntheticBase(types.OCIManifestSchema1)
		_, err := ociimage.WriteLayout(ctx, filepath.Join(dir, "base"), "", base)
		Expect(err).ToNot(HaveOccurred())
		file := filepath.Join(dir, "file")
		Expect(os.WriteFile(file, []byte("data"), 0o644)).To(Succeed())
		srv := httptest.NewServer(registry.New())
		DeferCleanup(srv.Close)

		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, err = ociimage.Load(ended, "oci:"+filepath.Join(dir, "base"), ociimage.DefaultPlatform)
		Expect(err).To(MatchError(context.Canceled), "Load")
		_, err = ociimage.Build(ended, ociimage.Spec{Files: []ociimage.File{{Path: "/file", Source: file}}})
		Expect(err).To(MatchError(context.Canceled), "Build from scratch")
		_, err = ociimage.Build(ended, ociimage.Spec{Base: base, Files: []ociimage.File{{Path: "/file", Source: file}}})
		Expect(err).To(MatchError(context.Canceled), "Build onto a base")
		_, err = ociimage.WriteLayout(ended, filepath.Join(dir, "layout"), "", base)
		Expect(err).To(MatchError(context.Canceled), "WriteLayout")
		Expect(ociimage.WriteArchive(ended, filepath.Join(dir, "base.tar"), "base:dev", base)).To(MatchError(context.Canceled), "WriteArchive")
		_, err = ociimage.Push(ended, filepath.Join(dir, "base"), srv.Listener.Addr().String()+"/base:dev")
		Expect(err).To(MatchError(context.Canceled), "Push")
	})

	DescribeTable("stops writing a layer when the context ends",
		func(ctx SpecContext, write func(ctx context.Context, dir string, img v1.Image) error) {
			content := make([]byte, 1<<20)
			_, _ = rand.Read(content)
			writing, cancel := context.WithCancel(ctx)
			img, err := mutate.AppendLayers(empty.Image, cancelingLayer{Layer: static.NewLayer(content, types.OCILayer), cancel: cancel})
			Expect(err).ToNot(HaveOccurred())
			Expect(write(writing, GinkgoT().TempDir(), img)).To(MatchError(context.Canceled))
		},
		Entry("an OCI layout", func(ctx context.Context, dir string, img v1.Image) error {
			_, err := ociimage.WriteLayout(ctx, filepath.Join(dir, "layout"), "", img)
			return err
		}),
		Entry("a docker archive", func(ctx context.Context, dir string, img v1.Image) error {
			return ociimage.WriteArchive(ctx, filepath.Join(dir, "image.tar"), "image:dev", img)
		}),
	)
})
