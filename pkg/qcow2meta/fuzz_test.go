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

package qcow2meta

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"testing"
	"time"
)

// The seed corpus in testdata/fuzz holds images qemu-img and qemu-io
// wrote; images this package writes are added as seeds in code. Rewrite
// the corpus with
//
//	go test ./pkg/qcow2meta -run TestFuzzSeeds -update-fuzz-seeds
//
// Fuzz FuzzCheck with a short -fuzzminimizetime (say 5s): minimizing an
// image of a few KiB takes the default minute for every new input.
var updateFuzzSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite the seed corpus in testdata/fuzz with images qemu-img writes")

const (
	// maxFuzzFileSize: a fuzzed image is a file of up to 1 TiB, its bytes
	// followed by zeroes, as a sparse file or a block device would be.
	maxFuzzFileSize = 1 << 40
	// maxFuzzAlloc is what checking any such file may allocate.
	maxFuzzAlloc = 64 << 20
	// maxFuzzDuration is what checking it may take while fuzzing. The
	// seed corpus, run as a test, has no such bound: go test's -timeout
	// catches a hang there, and tests do not assert wall-clock times.
	maxFuzzDuration = 10 * time.Second
)

func FuzzReadHeader(f *testing.F) {
	for _, img := range createdImages(f) {
		f.Add(firstCluster(img))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := readHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		cs := h.ClusterSize()
		switch {
		case h.ClusterBits < minClusterBits || h.ClusterBits > maxClusterBits:
			t.Fatalf("cluster bits %d", h.ClusterBits)
		case uint64(h.HeaderLength) > cs:
			t.Fatalf("header length %d with clusters of %d", h.HeaderLength, cs)
		case h.L1Size > maxL1Entries:
			t.Fatalf("L1 size %d", h.L1Size)
		case h.Size > uint64(h.L1Size)*cs*(cs/h.l2EntrySize()) || h.Size > math.MaxInt64:
			t.Fatalf("virtual size %d with an L1 size of %d", h.Size, h.L1Size)
		case h.RefcountTableClusters == 0 || uint64(h.RefcountTableClusters)*cs > maxRefcountTableBytes:
			t.Fatalf("refcount table of %d clusters of %d", h.RefcountTableClusters, cs)
		case h.NbSnapshots > maxSnapshots:
			t.Fatalf("%d snapshots", h.NbSnapshots)
		case len(h.BackingFile) > maxBackingNameLength || len(h.BackingFormat) > maxBackingFormatLength:
			t.Fatalf("backing %q format %q", h.BackingFile, h.BackingFormat)
		case uint64(len(h.DataFile)) > cs:
			t.Fatalf("data file name of %d bytes", len(h.DataFile))
		}
		if b := h.Bitmaps; b != nil && (b.Count == 0 || b.Count > maxBitmaps || b.DirectorySize > maxBitmapDirectorySize) {
			t.Fatalf("bitmaps extension %+v", *b)
		}
	})
}

func FuzzCheck(f *testing.F) {
	addImages(f)
	f.Fuzz(func(t *testing.T, data []byte, zeroes uint64) {
		var res *CheckResult
		size, err := bounded(t, "checking", data, zeroes, func(ctx context.Context, size int64) (err error) {
			res, err = check(ctx, zeroPadded(data), size)
			return err
		})
		if err != nil {
			return
		}
		problems := res.Corruptions + res.Leaks
		switch {
		case len(res.Problems) > maxMessages:
			t.Fatalf("%d problems listed", len(res.Problems))
		case problems == 0 && len(res.Problems) != 0, problems != 0 && len(res.Problems) == 0:
			t.Fatalf("%s", res)
		case uint64(res.ImageEndOffset) > (uint64(size)+(1<<maxClusterBits))&^(1<<maxClusterBits-1):
			t.Fatalf("image end offset %d in a file of %d bytes", res.ImageEndOffset, size)
		}
	})
}

// maxFuzzExtents is the cap FuzzReadMap gives ReadMap.
const maxFuzzExtents = 1 << 16

func FuzzReadMap(f *testing.F) {
	addImages(f)
	f.Fuzz(func(t *testing.T, data []byte, zeroes uint64) {
		var m *Map
		size, err := bounded(t, "mapping", data, zeroes, func(ctx context.Context, size int64) (err error) {
			m, err = ReadMap(ctx, zeroPadded(data), size, maxFuzzExtents)
			return err
		})
		if err != nil {
			return
		}
		if len(m.Extents) > maxFuzzExtents {
			t.Fatalf("%d extents", len(m.Extents))
		}
		cs := int64(m.Header.ClusterSize())
		var end int64
		for i, e := range m.Extents {
			switch {
			case e.Length <= 0 || e.Guest < end || e.Guest+e.Length > int64(m.Header.Size):
				t.Fatalf("extent %d %+v after guest offset %d, virtual size %d", i, e, end, m.Header.Size)
			case !e.Zero() && (e.Host%cs != 0 || e.Host < cs || e.Host+e.Length > size):
				t.Fatalf("extent %d %+v in a file of %d bytes, clusters of %d", i, e, size, cs)
			}
			end = e.Guest + e.Length
		}
	})
}

// addImages adds the images CreateOverlay writes as seeds of a fuzz
// target that takes an image's bytes and the zeroes that follow them.
func addImages(f *testing.F) {
	for _, img := range createdImages(f) {
		data := bytes.TrimRight(img, "\x00")
		f.Add(data, uint64(len(img)-len(data)))
	}
}

// bounded runs fn on a file of data followed by zeroes, of the size it
// returns, and fails t when fn allocates more than maxFuzzAlloc or, while
// fuzzing, takes more than maxFuzzDuration. It returns fn's error.
func bounded(t *testing.T, what string, data []byte, zeroes uint64, fn func(ctx context.Context, size int64) error) (int64, error) {
	size := int64(min(uint64(len(data))+zeroes, maxFuzzFileSize))
	ctx := context.Background()
	if fuzzing() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxFuzzDuration)
		defer cancel()
		// The fuzzing engine does not time an input out: a loop that
		// does not look at ctx would hang it.
		watchdog := time.AfterFunc(2*maxFuzzDuration, func() {
			panic(fmt.Sprintf("%s %d bytes followed by zeroes up to %d hangs", what, len(data), size))
		})
		defer watchdog.Stop()
	}
	// runtime/metrics, not runtime.ReadMemStats: stopping the world at
	// every exec cut the fuzzer to a few execs a second.
	allocs := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(allocs)
	before := allocs[0].Value.Uint64()
	err := fn(ctx, size)
	metrics.Read(allocs)
	if allocated := allocs[0].Value.Uint64() - before; allocated > maxFuzzAlloc {
		t.Fatalf("%s %d bytes followed by zeroes up to %d allocated %d bytes", what, len(data), size, allocated)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s %d bytes followed by zeroes up to %d took more than %s", what, len(data), size, maxFuzzDuration)
	}
	return size, err
}

// fuzzing says whether go test runs with -fuzz, not only the seed corpus.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}

// createdImages are images CreateOverlay writes, with small clusters so
// that the fuzzing engine mutates few bytes.
func createdImages(f *testing.F) [][]byte {
	var images [][]byte
	for _, opts := range []Options{
		{ClusterSize: 512},
		{ClusterSize: 4096, LazyRefcounts: true},
		{ClusterSize: 16 << 10, ExtendedL2: true},
	} {
		img, err := newLayout("/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img", "raw", 1<<30, opts)
		if err != nil {
			f.Fatal(err)
		}
		images = append(images, img)
	}
	return images
}

// firstCluster is the header cluster of an image without its trailing
// zeroes.
func firstCluster(img []byte) []byte {
	cs := uint64(1) << (img[23] & 0x1f)
	return bytes.TrimRight(img[:min(cs, uint64(len(img)))], "\x00")
}

// The images of the seed corpus: what qemu-img and qemu-io write over a
// backing file, with 512-byte clusters (unless they need larger ones) so
// that each is a few KiB.
var seedImages = []struct {
	name    string
	options string
	// commands are qemu-io commands run together, or a qemu-img command
	// in which "IMAGE" stands for the image.
	commands [][]string
	// zeroes past the image: it lies in a longer sparse file.
	zeroes uint64
	// headerOnly: the image is too large a seed for FuzzCheck.
	headerOnly bool
	// noBacking: the image has no backing file. The others are written
	// over one in a temporary directory and then name another, and
	// qemu-img repairs a dirty image as it renames its backing.
	noBacking bool
}{
	{name: "empty"},
	{name: "writes", commands: [][]string{{"write -P 0xa5 0 4k"}, {"write -P 0x5a 700k 1k"}}},
	{name: "sparse", commands: [][]string{{"write -P 0xa5 0 2k"}}, zeroes: 4 << 30},
	{name: "compressed", commands: [][]string{{"write -c -P 0x11 0 512"}, {"write -c 64k 512"}, {"write 128k 1k"}}},
	{name: "zeroes-and-discards", commands: [][]string{{"write 0 4k"}, {"write -z 1k 1k"}, {"discard 2k 1k"}, {"write -z 600k 4k"}}},
	{name: "refcount-bits-1", options: "refcount_bits=1", commands: [][]string{{"write 0 4k"}}},
	{name: "refcount-bits-64", options: "refcount_bits=64", commands: [][]string{{"write 0 4k"}}},
	{name: "lazy-refcounts-dirty", options: "lazy_refcounts=on", commands: [][]string{{"write 0 2k", "abort"}}, noBacking: true},
	{name: "bitmaps", commands: [][]string{
		{"qemu-img", "bitmap", "--add", "IMAGE", "checkpoint-1"}, {"write 0 2k"},
		{"qemu-img", "bitmap", "--add", "IMAGE", "checkpoint-2"}, {"write 512k 1k"},
	}},
	{name: "version-2", options: "compat=0.10", commands: [][]string{{"write 0 2k"}}},
	{name: "snapshot", commands: [][]string{{"write 0 1k"}, {"qemu-img", "snapshot", "-c", "s1", "IMAGE"}, {"write 0 512"}}},
	{name: "extended-l2", options: "cluster_size=16k,extended_l2=on", commands: [][]string{{"write 0 4k"}, {"write -z 64k 16k"}}, headerOnly: true},
}

// TestFuzzSeeds rewrites the seed corpus with -update-fuzz-seeds.
func TestFuzzSeeds(t *testing.T) {
	if !*updateFuzzSeeds {
		t.Skip("rewrites the seed corpus with -update-fuzz-seeds")
	}
	dir := t.TempDir()
	backing := filepath.Join(dir, "golden.raw")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, seed := range seedImages {
		path := filepath.Join(dir, seed.name+".qcow2")
		create := []string{"create", "-q", "-f", "qcow2", "-o", "cluster_size=512"}
		if !seed.noBacking {
			create = append(create, "-b", backing, "-F", "raw")
		}
		if seed.options != "" {
			create = append(create, "-o", seed.options)
		}
		runTool(t, "qemu-img", append(create, path, "1M")...)
		for _, c := range seed.commands {
			if c[0] == "qemu-img" {
				args := slices.Clone(c[1:])
				args[slices.Index(args, "IMAGE")] = path
				runTool(t, "qemu-img", args...)
				continue
			}
			args := []string{"-f", "qcow2"}
			for _, io := range c {
				args = append(args, "-c", io)
			}
			// abort leaves the image as a crash would, and qemu-io with it.
			cmd := exec.Command("qemu-io", append(args, path)...)
			cmd.Dir = dir
			_ = cmd.Run()
		}
		if !seed.noBacking {
			// The corpus must not name a path of this machine.
			runTool(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-b", "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img", "-F", "raw", path)
		}

		img, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		writeSeed(t, "FuzzReadHeader", seed.name, firstCluster(img))
		if !seed.headerOnly {
			data := bytes.TrimRight(img, "\x00")
			writeSeed(t, "FuzzCheck", seed.name, data, uint64(len(img)-len(data))+seed.zeroes)
			writeSeed(t, "FuzzReadMap", seed.name, data, uint64(len(img)-len(data))+seed.zeroes)
		}
	}
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// writeSeed writes a corpus entry in the format of go test fuzz v1.
func writeSeed(t *testing.T, target, name string, data []byte, more ...uint64) {
	t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, "go test fuzz v1\n[]byte(%q)\n", data)
	for _, v := range more {
		fmt.Fprintf(&b, "uint64(%d)\n", v)
	}
	dir := filepath.Join("testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "qemu-"+name), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
