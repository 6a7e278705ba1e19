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

package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
)

// AnnotationKey is the VMI annotation that configures this hook.
const AnnotationKey = "overlay.kubevirt-qcow2.io/disks"

// Config is the annotation's content.
type Config struct {
	// Disks lists the VMI disks to turn into overlays.
	Disks []DiskConfig `json:"disks"`
	// Identity is how new overlays fingerprint their backing:
	// "sampled-sha256" (default) or "sha256".
	Identity string `json:"identity,omitempty"`
	// Create tunes new overlay images.
	Create CreateConfig `json:"create,omitzero"`
}

// DiskConfig selects one disk.
type DiskConfig struct {
	// Name is the disk's name in spec.domain.devices.disks (and the name of
	// its volume).
	Name string `json:"name"`
	// BackingFormat is the format of the disk's original source, raw or
	// qcow2; empty takes the format KubeVirt gave the disk.
	BackingFormat string `json:"backingFormat,omitempty"`
	// Persistent overlays live in the sidecar's PVC and are reused on
	// every start; ephemeral ones live and die with the pod.
	Persistent bool `json:"persistent,omitempty"`
	// Path of a persistent overlay relative to the PVC; empty means
	// "<namespace>/<vmi name>/<disk name>.qcow2".
	Path string `json:"path,omitempty"`
	// Size of the overlay; empty means the backing's size. A number of
	// bytes or a string with a binary suffix ("20Gi").
	Size Size `json:"size,omitempty"`
	// Backing is the original image as a path relative to the sidecar's
	// PVC, in place of the disk's own source. Kubernetes mounts a claim
	// once per pod, so the sidecar's claim cannot also be the disk's
	// volume: the disk's volume then only holds the place (an emptyDisk),
	// and the overlay is made over this image.
	Backing string `json:"backing,omitempty"`
}

// CreateConfig tunes new overlays; zero values take QEMU's defaults.
type CreateConfig struct {
	ClusterSize   Size `json:"clusterSize,omitempty"`
	ExtendedL2    bool `json:"extendedL2,omitempty"`
	LazyRefcounts bool `json:"lazyRefcounts,omitempty"`
}

// Size is a byte count written as a number or with a binary suffix.
type Size int64

var sizeSuffixes = []struct {
	suffix string
	shift  uint
}{{"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}, {"Pi", 50}}

// UnmarshalJSON accepts 1073741824, "1073741824" and "1Gi".
func (s *Size) UnmarshalJSON(data []byte) error {
	var text string
	if err := json.Unmarshal(data, &text); err != nil {
		var n int64
		if err := json.Unmarshal(data, &n); err != nil {
			return fmt.Errorf("size %s is neither a byte count nor a string like \"20Gi\"", data)
		}
		text = strconv.FormatInt(n, 10)
	}
	v, err := parseSize(text)
	if err != nil {
		return err
	}
	*s = Size(v)
	return nil
}

func parseSize(text string) (int64, error) {
	shift := uint(0)
	digits := text
	for _, sfx := range sizeSuffixes {
		if strings.HasSuffix(text, sfx.suffix) {
			shift, digits = sfx.shift, strings.TrimSuffix(text, sfx.suffix)
			break
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("invalid size %q", text)
	}
	return n << shift, nil
}

// ParseConfig reads the annotation. Unknown fields, duplicate disks and
// values out of range are errors: a typo must not turn into a VM that
// silently writes to its golden image's copy-free path.
func ParseConfig(text string) (*Config, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	cfg := &Config{}
	if err := dec.Decode(cfg); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationKey, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("annotation %s: trailing data after the JSON object", AnnotationKey)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationKey, err)
	}
	return cfg, nil
}

func (c *Config) validate() error {
	if c.Disks == nil {
		return fmt.Errorf(`"disks" is missing`)
	}
	seen := map[string]bool{}
	paths := map[string]string{}
	for i, d := range c.Disks {
		field := fmt.Sprintf("disks[%d]", i)
		if d.Name == "" {
			return fmt.Errorf("%s.name is empty", field)
		}
		if seen[d.Name] {
			return fmt.Errorf("%s.name: disk %q is listed twice", field, d.Name)
		}
		seen[d.Name] = true
		switch d.BackingFormat {
		case "", "raw", "qcow2":
		default:
			return fmt.Errorf("%s.backingFormat: %q is not raw or qcow2", field, d.BackingFormat)
		}
		if d.Path != "" {
			if !d.Persistent {
				return fmt.Errorf("%s.path: only persistent overlays have a path", field)
			}
			if err := checkRelativePath(d.Path); err != nil {
				return fmt.Errorf("%s.path: %w", field, err)
			}
			if other, dup := paths[d.Path]; dup {
				return fmt.Errorf("%s.path: %q is also the path of disk %q", field, d.Path, other)
			}
			paths[d.Path] = d.Name
		}
		if d.Size < 0 {
			return fmt.Errorf("%s.size is negative", field)
		}
		if d.Backing != "" {
			if err := checkRelativePath(d.Backing); err != nil {
				return fmt.Errorf("%s.backing: %w", field, err)
			}
		}
	}
	for i, d := range c.Disks {
		if other, dup := paths[d.Backing]; dup && d.Backing != "" {
			return fmt.Errorf("disks[%d].backing: %q is the overlay path of disk %q", i, d.Backing, other)
		}
	}
	switch c.Identity {
	case "", overlay.IdentitySampled, overlay.IdentityFull:
	default:
		return fmt.Errorf("identity: %q is not %q or %q", c.Identity, overlay.IdentitySampled, overlay.IdentityFull)
	}
	if cs := int64(c.Create.ClusterSize); cs != 0 && (cs < 512 || cs > 2<<20 || cs&(cs-1) != 0) {
		return fmt.Errorf("create.clusterSize: %d is not a power of two between 512 and 2Mi", cs)
	}
	if c.Create.ExtendedL2 && c.Create.ClusterSize != 0 && c.Create.ClusterSize < 16<<10 {
		return fmt.Errorf("create.extendedL2 needs create.clusterSize of at least 16Ki")
	}
	return nil
}

// checkRelativePath accepts a clean relative path that stays inside its
// directory and names a file.
func checkRelativePath(p string) error {
	switch {
	case path.IsAbs(p):
		return fmt.Errorf("%q is absolute; it is relative to the overlay PVC", p)
	case path.Clean(p) != p:
		return fmt.Errorf("%q is not a clean path (%q)", p, path.Clean(p))
	case p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("%q leaves the overlay PVC", p)
	case strings.HasSuffix(p, overlay.RecordSuffix):
		return fmt.Errorf("%q ends like an overlay record", p)
	case !xmlText(p) || strings.ContainsAny(p, "\t\n\r"):
		return fmt.Errorf("%q contains characters a domain XML cannot carry", p)
	}
	return nil
}

// Marshal renders the configuration as annotation text.
func (c *Config) Marshal() (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		return "", err
	}
	return strings.TrimSpace(buf.String()), nil
}
