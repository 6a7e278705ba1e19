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

// Package ociimage builds container images without a container daemon:
// from scratch, or as a base image with one layer of files on top. Builds
// are reproducible: the same base, files and settings give the same
// digests, whatever the machine, the time or the files' owners and
// timestamps. Images are written as OCI image layouts or docker archives
// and pushed with go-containerregistry.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
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
	// UID and GID own the file in the image.
	UID, GID int
	// Capabilities are file capabilities (permitted and effective), by
	// number (unix.CAP_*), written as the security.capability extended
	// attribute: what a non-root process gains by running the file.
	Capabilities []int
}

// Spec describes an image.
type Spec struct {
	// Base is the image the files are layered onto; nil builds from
	// scratch. The base's layers are kept as they are and its config is
	// the starting point of the new one.
	Base v1.Image
	// Tree is a directory on this machine whose whole content, owned by
	// root, becomes one layer between the base and Files: the root file
	// system of an image made from unpacked packages.
	Tree  string
	Files []File
	// Entrypoint, Cmd, User and WorkingDir replace the base's when set.
	Entrypoint []string
	Cmd        []string
	User       string
	WorkingDir string
	// Env entries (NAME=VALUE) replace the base's of the same name or are
	// added; Labels are merged over the base's.
	Env    []string
	Labels map[string]string
	// OS and Architecture of an image from scratch default to linux and
	// amd64; a layered image keeps its base's.
	OS           string
	Architecture string
	// Created is the creation time recorded in the config and as the
	// files' modification time. When zero: the Unix epoch from scratch,
	// the base's creation time when layered, for reproducibility (set it
	// from SOURCE_DATE_EPOCH to record a date).
	Created time.Time
}

const createdBy = "kubevirt-qcow2 ociimage"

// Build assembles the image. It reads the files, the tree and the base's
// layers as it goes, and stops between two of them when ctx ends.
func Build(ctx context.Context, spec Spec) (v1.Image, error) {
	base, cfg, err := startFrom(spec.Base)
	if err != nil {
		return nil, fmt.Errorf("build image: base: %w", err)
	}
	created := spec.Created
	if created.IsZero() {
		created = cfg.Created.Time
	}
	created = created.UTC()

	if spec.Tree != "" {
		treeTar, err := tarTree(ctx, spec.Tree, created)
		if err != nil {
			return nil, fmt.Errorf("build image: %w", err)
		}
		if base, err = appendLayer(base, treeTar, created); err != nil {
			return nil, err
		}
	}
	var lower map[string]*tar.Header
	if spec.Base != nil || spec.Tree != "" {
		if lower, err = fileSystem(withContext(ctx, base)); err != nil {
			return nil, fmt.Errorf("build image: read base: %w", err)
		}
	}
	img := base
	if len(spec.Files) > 0 || spec.Tree == "" {
		layerTar, err := tarFiles(ctx, spec.Files, lower, created)
		if err != nil {
			return nil, fmt.Errorf("build image: %w", err)
		}
		if img, err = appendLayer(base, layerTar, created); err != nil {
			return nil, err
		}
	}
	// Append recorded the layer's diff id and history in the config.
	if cfg, err = img.ConfigFile(); err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.Created = v1.Time{Time: created}
	if spec.Base == nil {
		cfg.OS = orDefault(spec.OS, "linux")
		cfg.Architecture = orDefault(spec.Architecture, "amd64")
	}
	applySettings(&cfg.Config, spec)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	return img, nil
}

// appendLayer adds one uncompressed tar as a layer of img.
func appendLayer(img v1.Image, layerTar []byte, created time.Time) (v1.Image, error) {
	layerType, err := layerMediaType(img)
	if err != nil {
		return nil, fmt.Errorf("build image: base: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(layerType))
	if err != nil {
		return nil, fmt.Errorf("build image: layer: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: layerType,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: createdBy},
	})
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	return img, nil
}

// startFrom is the image to append to and its config: the base, or an
// empty OCI image.
func startFrom(base v1.Image) (v1.Image, *v1.ConfigFile, error) {
	if base == nil {
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		return img, &v1.ConfigFile{Created: v1.Time{Time: time.Unix(0, 0)}}, nil
	}
	cfg, err := base.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	return base, cfg, nil
}

// layerMediaType matches the new layer to the manifest's format: registries
// refuse OCI layers in a Docker manifest.
func layerMediaType(img v1.Image) (types.MediaType, error) {
	mt, err := img.MediaType()
	if err != nil {
		return "", err
	}
	if mt == types.DockerManifestSchema2 {
		return types.DockerLayer, nil
	}
	return types.OCILayer, nil
}

func applySettings(c *v1.Config, spec Spec) {
	if spec.Entrypoint != nil {
		c.Entrypoint = spec.Entrypoint
	}
	if spec.Cmd != nil {
		c.Cmd = spec.Cmd
	}
	if spec.User != "" {
		c.User = spec.User
	}
	if spec.WorkingDir != "" {
		c.WorkingDir = spec.WorkingDir
	}
	for _, e := range spec.Env {
		name, _, _ := strings.Cut(e, "=")
		c.Env = slices.DeleteFunc(c.Env, func(old string) bool { return strings.HasPrefix(old, name+"=") })
		c.Env = append(c.Env, e)
	}
	if len(spec.Labels) > 0 {
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		maps.Copy(c.Labels, spec.Labels)
	}
}

// tarFiles makes the layer: the files and their parent directories, in
// name order, timestamps set to mtime. A parent the base (lower) already
// has keeps the base's owner, mode and time, so the layer changes nothing
// but the files; a parent missing there is root's, 0755. A file replaces
// the base's file at its path; the base's directories and symbolic links
// are refused as targets or parents, since writing over them would drop or
// redirect what the base holds there.
func tarFiles(ctx context.Context, files []File, lower map[string]*tar.Header, mtime time.Time) ([]byte, error) {
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
		if h, ok := lower[name]; ok && h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("image path %s is %s in the base image, not a regular file", f.Path, kind(h))
		}
		entries[name] = entry{name: name, file: f}
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if h, ok := lower[dir]; ok && h.Typeflag != tar.TypeDir {
				return nil, fmt.Errorf("image path %s: parent /%s is %s in the base image", f.Path, dir, kind(h))
			}
			entries[dir+"/"] = entry{name: dir + "/"}
		}
	}
	for n := range entries {
		if _, clash := entries[n+"/"]; clash && !strings.HasSuffix(n, "/") {
			return nil, fmt.Errorf("image path /%s is both a file and a directory", n)
		}
	}
	names := slices.Sorted(maps.Keys(entries))

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e := entries[n]
		hdr := &tar.Header{Name: n, ModTime: mtime, Format: tar.FormatPAX}
		if e.file == nil {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
			if h, ok := lower[strings.TrimSuffix(n, "/")]; ok {
				hdr.Mode, hdr.Uid, hdr.Gid, hdr.ModTime = h.Mode, h.Uid, h.Gid, h.ModTime
			}
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
		hdr.Uid, hdr.Gid = e.file.UID, e.file.GID
		if len(e.file.Capabilities) > 0 {
			xattr, err := capabilityXattr(e.file.Capabilities)
			if err != nil {
				return nil, fmt.Errorf("image file %s: %w", e.file.Path, err)
			}
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": xattr}
		}
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

// tarTree makes a layer of everything under dir, in name order: directories,
// regular files and symbolic links with their modes (set-id bits included),
// owned by root, timestamps set to mtime. Hard links become copies; any
// other kind of file is refused, since an image never needs one.
func tarTree(ctx context.Context, dir string, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("tree %s: %s is %s, not a file, directory or symbolic link", dir, p, info.Mode().Type())
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = mtime, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// capabilityXattr encodes file capabilities as the kernel reads them from
// security.capability: struct vfs_cap_data, revision 2, effective flag set,
// permitted sets of two 32-bit words, inheritable sets empty.
func capabilityXattr(caps []int) (string, error) {
	var permitted [2]uint32
	for _, c := range caps {
		if c < 0 || c >= 64 {
			return "", fmt.Errorf("capability %d out of range", c)
		}
		permitted[c/32] |= 1 << (c % 32)
	}
	const revision2, effective = 0x02000000, 0x000001
	b := binary.LittleEndian.AppendUint32(nil, revision2|effective)
	for _, p := range permitted {
		b = binary.LittleEndian.AppendUint32(b, p)
		b = binary.LittleEndian.AppendUint32(b, 0)
	}
	return string(b), nil
}

func kind(h *tar.Header) string {
	switch h.Typeflag {
	case tar.TypeReg:
		return "a regular file"
	case tar.TypeDir:
		return "a directory"
	case tar.TypeSymlink:
		return "a symbolic link to " + h.Linkname
	case tar.TypeLink:
		return "a hard link"
	default:
		return fmt.Sprintf("a special file (type %q)", h.Typeflag)
	}
}

// fileSystem is the headers of what img's layers leave visible, whiteouts
// applied, keyed by clean relative path.
func fileSystem(img v1.Image) (map[string]*tar.Header, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers, nil
		}
		if err != nil {
			return nil, err
		}
		headers[strings.TrimPrefix(path.Clean("/"+h.Name), "/")] = h
	}
}

func orDefault(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}
