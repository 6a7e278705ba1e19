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
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// refAnnotation names an image inside an OCI image layout.
const refAnnotation = "org.opencontainers.image.ref.name"

// Prefixes of image sources that are not registry references, as skopeo
// spells them.
const (
	SourceLayout        = "oci:"
	SourceDockerArchive = "docker-archive:"
)

// DefaultPlatform is what a multi-platform base resolves to.
var DefaultPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Load reads an image from source: "oci:DIR" (an OCI image layout; its
// only image, or the one for platform), "docker-archive:FILE" (a tarball
// as `docker save` writes it) or a registry reference, resolved for
// platform when it names an index. Registry credentials come from the
// Docker config, as `docker login` leaves them. The image reads its layers
// when they are used, later; from a registry, those reads end with ctx
// too.
func Load(ctx context.Context, source string, platform v1.Platform) (v1.Image, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load image %s: %w", source, err)
	}
	switch {
	case strings.HasPrefix(source, SourceLayout):
		img, err := fromLayout(strings.TrimPrefix(source, SourceLayout), platform)
		if err != nil {
			return nil, fmt.Errorf("load image %s: %w", source, err)
		}
		return img, nil
	case strings.HasPrefix(source, SourceDockerArchive):
		img, err := tarball.ImageFromPath(strings.TrimPrefix(source, SourceDockerArchive), nil)
		if err != nil {
			return nil, fmt.Errorf("load image %s: %w", source, err)
		}
		return img, nil
	}
	ref, err := name.ParseReference(source)
	if err != nil {
		return nil, fmt.Errorf("load image %s: %w", source, err)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(platform))
	if err != nil {
		return nil, fmt.Errorf("load image %s: %w", source, err)
	}
	return img, nil
}

// fromLayout picks the image of a layout: the only one, else the one of
// platform, looking one level into indexes.
func fromLayout(dir string, platform v1.Platform) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	return pickImage(idx, platform)
}

func pickImage(idx v1.ImageIndex, platform v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var found []v1.Descriptor
	for _, d := range m.Manifests {
		if d.MediaType.IsIndex() {
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			return pickImage(child, platform)
		}
		if len(m.Manifests) == 1 || (d.Platform != nil && d.Platform.Satisfies(platform)) {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d images for %s/%s, want one", len(found), platform.OS, platform.Architecture)
	}
	return idx.Image(found[0].Digest)
}

// WriteLayout writes img as the only image of a fresh OCI image layout in
// dir, tagged ref (annotation org.opencontainers.image.ref.name). An
// existing layout in dir is replaced. When ctx ends, the layer being
// written stops and WriteLayout fails, leaving a partial layout.
func WriteLayout(ctx context.Context, dir, ref string, img v1.Image) (v1.Hash, error) {
	if err := ctx.Err(); err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{refAnnotation: ref}))
	}
	if err := p.AppendImage(withContext(ctx, img), opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	return digest, nil
}

// WriteArchive writes img as a docker archive (`docker load`, `kind load
// image-archive`) tagged ref. When ctx ends, the layer being written stops
// and WriteArchive fails, leaving a partial file.
func WriteArchive(ctx context.Context, file, ref string, img v1.Image) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write archive %s: %w", file, err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("write archive %s: %w", file, err)
	}
	if err := tarball.WriteToFile(file, tag, withContext(ctx, img)); err != nil {
		return fmt.Errorf("write archive %s: %w", file, err)
	}
	return nil
}

// Push copies the image of an OCI image layout to a registry reference,
// with the credentials of the Docker config, and returns its digest. It
// stops when ctx ends.
func Push(ctx context.Context, dir, to string) (v1.Hash, error) {
	if err := ctx.Err(); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", dir, err)
	}
	img, err := fromLayout(dir, DefaultPlatform)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", dir, err)
	}
	ref, err := name.ParseReference(to)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", dir, err)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s to %s: %w", dir, to, err)
	}
	return img.Digest()
}
