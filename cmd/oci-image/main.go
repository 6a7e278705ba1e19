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

// Command oci-image builds container images without a container daemon and
// pushes them. Build, from scratch or onto a base image:
//
//	oci-image --out _out/images/overlay-hook --ref kubevirt-qcow2/overlay-hook:dev \
//	    --file _out/bin/overlay-hook:/usr/bin/overlay-hook:0755 \
//	    --entrypoint /usr/bin/overlay-hook
//	oci-image --base quay.io/kubevirt/virt-api:v1.7.0 --out _out/images/virt-api \
//	    --ref registry.example/kubevirt/virt-api:v1.7.0-qcow2 \
//	    --file _out/kubevirt-v1.7.0/bin/virt-api:/usr/bin/virt-api:0555:0:0
//
// The base is a registry reference, oci:DIR (an OCI image layout) or
// docker-archive:FILE. It writes an OCI image layout (and with --archive a
// docker archive), then prints the manifest digest and the command that
// pushes it. The same inputs give the same digest; SOURCE_DATE_EPOCH, when
// set, is the recorded creation time. Push:
//
//	oci-image push _out/images/virt-api registry.example/kubevirt/virt-api:v1.7.0-qcow2
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"golang.org/x/sys/unix"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	log, err := logging.New(logging.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx = logging.Setup(ctx, log)
	if len(os.Args) > 1 && os.Args[1] == "push" {
		err = push(ctx, os.Args[2:])
	} else {
		err = build(ctx, os.Args[1:])
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

func push(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: oci-image push LAYOUT-DIR REFERENCE")
	}
	digest, err := ociimage.Push(ctx, args[0], args[1])
	if err != nil {
		return err
	}
	fmt.Printf("pushed %s@%s\n", args[1], digest)
	return nil
}

func build(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("oci-image", flag.ContinueOnError)
	out := fs.String("out", "", "directory of the OCI image layout to write (replaced)")
	archive := fs.String("archive", "", "also write a docker archive (docker load, kind load image-archive) to this file")
	ref := fs.String("ref", "", "image reference recorded in the layout and archive, e.g. registry/name:tag")
	base := fs.String("base", "", "base image: a registry reference, oci:DIR or docker-archive:FILE; empty for scratch")
	platform := fs.String("platform", "linux/amd64", "OS/ARCH picked from a multi-platform base")
	entrypoint := fs.String("entrypoint", "", "entrypoint, words separated by spaces (default: the base's)")
	user := fs.String("user", "", "user the image runs as (default: the base's)")
	tree := fs.String("tree", "", "a directory whose whole content, owned by root, is a layer under the files")
	var files, elfs, envs, labels, caps listFlag
	fs.Var(&files, "file", "SOURCE:IMAGE-PATH[:OCTAL-MODE[:UID:GID]], repeatable")
	fs.Var(&elfs, "elf", "SOURCE:IMAGE-PATH[:OCTAL-MODE]: a binary with the shared libraries it loads here, repeatable")
	fs.Var(&caps, "cap", "IMAGE-PATH=CAPABILITY: a file capability of a --file, e.g. cap_net_bind_service, repeatable")
	fs.Var(&envs, "env", "NAME=VALUE, repeatable")
	fs.Var(&labels, "label", "KEY=VALUE, repeatable")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *out == "" || len(files)+len(elfs) == 0 && *tree == "" {
		return fmt.Errorf("--out and at least one --file, --elf or --tree are required")
	}
	if *archive != "" && *ref == "" {
		return fmt.Errorf("--archive needs --ref")
	}

	spec := ociimage.Spec{Env: envs, User: *user, Tree: *tree, Labels: map[string]string{}}
	if *entrypoint != "" {
		spec.Entrypoint = strings.Fields(*entrypoint)
	}
	for _, f := range files {
		file, err := parseFile(f, true)
		if err != nil {
			return fmt.Errorf("--file %q: %w", f, err)
		}
		spec.Files = append(spec.Files, file)
	}
	for _, f := range elfs {
		file, err := parseFile(f, false)
		if err != nil {
			return fmt.Errorf("--elf %q: %w", f, err)
		}
		withLibs, err := ociimage.WithLibraries(ctx, file.Source, file.Path, file.Mode)
		if err != nil {
			return fmt.Errorf("--elf %q: %w", f, err)
		}
		spec.Files = append(spec.Files, withLibs...)
	}
	for _, c := range caps {
		if err := addCapability(spec.Files, c); err != nil {
			return fmt.Errorf("--cap %q: %w", c, err)
		}
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		secs, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", epoch, err)
		}
		spec.Created = time.Unix(secs, 0)
	}
	// An image whose inputs have not changed since it was written is left
	// as it is: make images runs in every make cluster and e2e run.
	key, err := inputsKey(args, spec, *base)
	if err != nil {
		return err
	}
	keyFile := filepath.Clean(*out) + ".inputs"
	if digest, ok := unchanged(keyFile, key, *out, *archive); ok {
		printBuilt(*out, *ref, digest)
		return nil
	}
	if err := os.Remove(keyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if *base != "" {
		goos, goarch, ok := strings.Cut(*platform, "/")
		if !ok {
			return fmt.Errorf("--platform %q: want OS/ARCH", *platform)
		}
		img, err := ociimage.Load(ctx, *base, v1.Platform{OS: goos, Architecture: goarch})
		if err != nil {
			return err
		}
		spec.Base = img
	}

	img, err := ociimage.Build(ctx, spec)
	if err != nil {
		return err
	}
	digest, err := ociimage.WriteLayout(ctx, *out, *ref, img)
	if err != nil {
		return err
	}
	if *archive != "" {
		if err := ociimage.WriteArchive(ctx, *archive, *ref, img); err != nil {
			return err
		}
	}
	if key != "" {
		if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o644); err != nil {
			return err
		}
	}
	printBuilt(*out, *ref, digest)
	return nil
}

func printBuilt(out, ref string, digest v1.Hash) {
	fmt.Printf("%s %s\n", out, digest)
	if ref != "" {
		fmt.Printf("  push: go run ./cmd/oci-image push %s %s\n", out, ref)
	}
}

// inputsKey is a digest of everything the image is made of: the
// arguments, each file's content, the tree's listing (path, mode, size,
// modification time) and a local base's. Empty for a registry base,
// whose tag may move: such an image is always built.
func inputsKey(args []string, spec ociimage.Spec, base string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q\n", args, os.Getenv("SOURCE_DATE_EPOCH"))
	for _, f := range spec.Files {
		if err := hashFile(h, f.Source); err != nil {
			return "", err
		}
	}
	if spec.Tree != "" {
		if err := hashListing(h, spec.Tree); err != nil {
			return "", err
		}
	}
	if base != "" {
		kind, path, _ := strings.Cut(base, ":")
		if kind != "oci" && kind != "docker-archive" {
			return "", nil
		}
		if err := hashListing(h, path); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(h, "file %q\n", path)
	_, err = io.Copy(h, f)
	return err
}

func hashListing(h io.Writer, root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %v %d %d\n", path, info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
}

// unchanged reports whether the layout at out (and the archive, if any)
// was written from the inputs key names, and the image's digest.
func unchanged(keyFile, key, out, archive string) (v1.Hash, bool) {
	old, err := os.ReadFile(keyFile)
	if key == "" || err != nil || strings.TrimSpace(string(old)) != key {
		return v1.Hash{}, false
	}
	if archive != "" {
		written, err := os.Stat(keyFile)
		if err != nil {
			return v1.Hash{}, false
		}
		// Written before the key file, and not since.
		if info, err := os.Stat(archive); err != nil || info.ModTime().After(written.ModTime()) {
			return v1.Hash{}, false
		}
	}
	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		return v1.Hash{}, false
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		return v1.Hash{}, false
	}
	return m.Manifests[0].Digest, true
}

// Capabilities --cap knows by name: those KubeVirt's images set.
var capabilities = map[string]int{"cap_net_bind_service": unix.CAP_NET_BIND_SERVICE}

func addCapability(files []ociimage.File, s string) error {
	path, name, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want IMAGE-PATH=CAPABILITY")
	}
	c, ok := capabilities[strings.ToLower(name)]
	if !ok {
		return fmt.Errorf("unknown capability %q", name)
	}
	for i := range files {
		if files[i].Path == path {
			files[i].Capabilities = append(files[i].Capabilities, c)
			return nil
		}
	}
	return fmt.Errorf("no --file at %s", path)
}

// parseFile reads SOURCE:IMAGE-PATH[:MODE[:UID:GID]]; owners only when
// withOwner.
func parseFile(s string, withOwner bool) (ociimage.File, error) {
	parts := strings.Split(s, ":")
	want, most := "SOURCE:IMAGE-PATH[:MODE]", 3
	if withOwner {
		want, most = "SOURCE:IMAGE-PATH[:MODE[:UID:GID]]", 5
	}
	if len(parts) < 2 || len(parts) > most || len(parts) == 4 {
		return ociimage.File{}, fmt.Errorf("want %s", want)
	}
	file := ociimage.File{Source: parts[0], Path: parts[1]}
	if len(parts) >= 3 {
		mode, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil {
			return file, fmt.Errorf("mode: %w", err)
		}
		file.Mode = os.FileMode(mode)
	}
	if len(parts) == 5 {
		var err error
		if file.UID, err = strconv.Atoi(parts[3]); err != nil {
			return file, fmt.Errorf("uid: %w", err)
		}
		if file.GID, err = strconv.Atoi(parts[4]); err != nil {
			return file, fmt.Errorf("gid: %w", err)
		}
	}
	return file, nil
}
