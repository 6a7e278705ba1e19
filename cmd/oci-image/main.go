// Command oci-image writes a container image built from scratch as an OCI
// image layout, without a container daemon:
//
//	oci-image --out _out/images/overlay-hook --ref kubevirt-qcow2/overlay-hook:dev \
//	    --file _out/bin/overlay-hook:/usr/bin/overlay-hook:0755 \
//	    --entrypoint /usr/bin/overlay-hook
//
// It prints the image's manifest digest. The same inputs give the same
// digest; SOURCE_DATE_EPOCH, when set, is the recorded creation time.
// Push the layout with any OCI tool, e.g. `skopeo copy oci:<out> docker://...`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("oci-image", flag.ContinueOnError)
	out := fs.String("out", "", "directory of the OCI image layout to write (replaced)")
	ref := fs.String("ref", "", "image reference recorded in the layout, e.g. name:tag")
	entrypoint := fs.String("entrypoint", "", "entrypoint, words separated by spaces")
	user := fs.String("user", "", "user the image runs as")
	var files, envs, labels listFlag
	fs.Var(&files, "file", "SOURCE:IMAGE-PATH[:OCTAL-MODE], repeatable")
	fs.Var(&envs, "env", "NAME=VALUE, repeatable")
	fs.Var(&labels, "label", "KEY=VALUE, repeatable")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *out == "" || len(files) == 0 {
		return fmt.Errorf("--out and at least one --file are required")
	}

	spec := ociimage.Spec{Env: envs, User: *user, Labels: map[string]string{}}
	if *entrypoint != "" {
		spec.Entrypoint = strings.Fields(*entrypoint)
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--file %q: want SOURCE:IMAGE-PATH[:MODE]", f)
		}
		file := ociimage.File{Source: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			mode, err := strconv.ParseUint(parts[2], 8, 32)
			if err != nil {
				return fmt.Errorf("--file %q: mode: %w", f, err)
			}
			file.Mode = os.FileMode(mode)
		}
		spec.Files = append(spec.Files, file)
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

	img, err := ociimage.Build(spec)
	if err != nil {
		return err
	}
	digest, err := ociimage.WriteLayout(*out, *ref, img)
	if err != nil {
		return err
	}
	fmt.Println(digest)
	return nil
}
