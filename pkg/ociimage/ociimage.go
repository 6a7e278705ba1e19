// Package ociimage builds small container images from scratch, without a
// container daemon: one layer holding the given files, an OCI config, and
// an OCI image layout on disk. Builds are reproducible: the same files and
// settings give the same digests, whatever the machine, the time or the
// files' owners and timestamps.
package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image.
type File struct {
	// Path inside the image, absolute.
	Path string
	// Source is the file on this machine to copy.
	Source string
	// Mode of the file in the image; 0644 when zero.
	Mode os.FileMode
}

// Spec describes an image.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
	// OS and Architecture default to linux and amd64.
	OS           string
	Architecture string
	// Created is the creation time recorded in the config and as the
	// files' modification time; the Unix epoch when zero, for
	// reproducibility (set it from SOURCE_DATE_EPOCH to record a date).
	Created time.Time
}

// Build assembles the image.
func Build(spec Spec) (v1.Image, error) {
	created := spec.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	layerTar, err := tarFiles(spec.Files, created)
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("build image: layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "kubevirt-qcow2 ociimage"},
	})
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Created = v1.Time{Time: created}
	cfg.OS = orDefault(spec.OS, "linux")
	cfg.Architecture = orDefault(spec.Architecture, "amd64")
	cfg.Config = v1.Config{
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		Env:        spec.Env,
		User:       spec.User,
		WorkingDir: spec.WorkingDir,
		Labels:     spec.Labels,
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	return img, nil
}

// WriteLayout writes img as the only image of a fresh OCI image layout in
// dir, tagged ref (annotation org.opencontainers.image.ref.name). An
// existing layout in dir is replaced.
func WriteLayout(dir, ref string, img v1.Image) (v1.Hash, error) {
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write layout %s: %w", dir, err)
	}
	return digest, nil
}

// tarFiles makes the layer: the files and their parent directories, in
// name order, owned by root, all timestamps set to mtime.
func tarFiles(files []File, mtime time.Time) ([]byte, error) {
	type entry struct {
		name string
		file *File
	}
	entries := map[string]entry{}
	for i := range files {
		f := &files[i]
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("image path %q is not a clean absolute file path", f.Path)
		}
		name := strings.TrimPrefix(f.Path, "/")
		if _, dup := entries[name]; dup {
			return nil, fmt.Errorf("image path %q is given twice", f.Path)
		}
		entries[name] = entry{name: name, file: f}
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			entries[dir+"/"] = entry{name: dir + "/"}
		}
	}
	for n := range entries {
		if _, clash := entries[n+"/"]; clash && !strings.HasSuffix(n, "/") {
			return nil, fmt.Errorf("image path /%s is both a file and a directory", n)
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		hdr := &tar.Header{Name: n, ModTime: mtime, Format: tar.FormatPAX}
		if e.file == nil {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(e.file.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", e.file.Path, err)
		}
		mode := e.file.Mode
		if mode == 0 {
			mode = 0o644
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, int64(mode.Perm()), int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func orDefault(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}
