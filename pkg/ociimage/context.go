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

package ociimage

import (
	"context"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
)

// withContext is img with layers that stop reading once ctx is done:
// go-containerregistry's layout and tarball writers and mutate.Extract
// take no context, and read every layer through these readers. The
// manifest, config and digests are img's.
func withContext(ctx context.Context, img v1.Image) v1.Image {
	return ctxImage{Image: img, ctx: ctx}
}

type ctxImage struct {
	v1.Image
	ctx context.Context
}

// Descriptor is img's, as the layout writer records it in the index.
func (i ctxImage) Descriptor() (*v1.Descriptor, error) {
	return partial.Descriptor(i.Image)
}

func (i ctxImage) Layers() ([]v1.Layer, error) {
	layers, err := i.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(layers))
	for n, l := range layers {
		out[n] = ctxLayer{Layer: l, ctx: i.ctx}
	}
	return out, nil
}

func (i ctxImage) LayerByDigest(h v1.Hash) (v1.Layer, error) {
	l, err := i.Image.LayerByDigest(h)
	if err != nil {
		return nil, err
	}
	return ctxLayer{Layer: l, ctx: i.ctx}, nil
}

func (i ctxImage) LayerByDiffID(h v1.Hash) (v1.Layer, error) {
	l, err := i.Image.LayerByDiffID(h)
	if err != nil {
		return nil, err
	}
	return ctxLayer{Layer: l, ctx: i.ctx}, nil
}

type ctxLayer struct {
	v1.Layer
	ctx context.Context
}

func (l ctxLayer) Compressed() (io.ReadCloser, error) {
	return l.open(l.Layer.Compressed)
}

func (l ctxLayer) Uncompressed() (io.ReadCloser, error) {
	return l.open(l.Layer.Uncompressed)
}

func (l ctxLayer) open(open func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	if err := l.ctx.Err(); err != nil {
		return nil, err
	}
	rc, err := open()
	if err != nil {
		return nil, err
	}
	return ctxReader{ReadCloser: rc, ctx: l.ctx}, nil
}

// ctxReader fails its reads once ctx is done.
type ctxReader struct {
	io.ReadCloser
	ctx context.Context
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.ReadCloser.Read(p)
}
