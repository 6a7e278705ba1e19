//go:build bench

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

// Package bench measures the backup data path against the local S3 server:
// the bytes an incremental uploads against a full backup, restore time
// against chain length, and, side by side in one run on the same server,
// our upload and restore of a disk filled with random data against a plain
// minio-go client moving the same file with its default settings, with the
// peak memory of each. Run by `make bench-backup` only (build tag "bench");
// it prints a Markdown report.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// maxRSS is the most an upload or restore may hold, whatever the
	// disk's size.
	maxRSS = 64 * mib
	// minRatio is the least share of the plain client's throughput ours
	// should reach; reported, not asserted.
	minRatio = 0.7
)

// Environment of the child process that moves the data, so its time and
// peak RSS are its own.
const (
	envChild  = "BACKUP_BENCH_CHILD"
	envURL    = "BACKUP_BENCH_S3_URL"
	envCreds  = "BACKUP_BENCH_CREDENTIALS"
	envBucket = "BACKUP_BENCH_BUCKET"
	// envKey is the object a plain child moves, or the command line
	// (JSON) a "pod" child runs.
	envKey  = "BACKUP_BENCH_KEY"
	envFile = "BACKUP_BENCH_FILE"
	envWork = "BACKUP_BENCH_WORK"
	// envCheckpoint names the checkpoint (and backup) the child uploads
	// or restores.
	envCheckpoint = "BACKUP_BENCH_CHECKPOINT"

	// envSizes lists the virtual sizes in GiB of the disks moved side
	// by side (default "4,8"); each needs three times its size free, and
	// two GiB more.
	envSizes = "BACKUP_BENCH_SIZES"
	// envRounds is how many times each transfer runs (default 2); the
	// report gives the fastest of each, so that a burst of load on a
	// shared machine hits one side less often.
	envRounds = "BACKUP_BENCH_ROUNDS"
)

// vm is the VM whose disk the child uploads and restores, in a location
// with this prefix.
var vm = catalog.VM{Namespace: "bench", Name: "vm"}

const prefix = "cluster"

// diskKey is the key, from the bucket's top, of the disk of checkpoint.
func diskKey(checkpoint string) string {
	return path.Join(catalog.Root(prefix), catalog.DiskPath(vm, checkpoint, checkpoint, "vda"))
}

func repository(t *testing.T, url, creds, bucket string) *backup.Repository {
	store, err := objectstore.NewS3(objectstore.Config{Bucket: bucket, S3URL: url, S3ForcePathStyle: true, CredentialsFile: creds})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateBucket(context.Background()); err != nil {
		t.Fatal(err)
	}
	return backup.NewRepository(store)
}

// bsl is the BackupStorageLocation of bucket, as the pods get it.
func bsl(s3URL, bucket string) []byte {
	return []byte(fmt.Sprintf(`{"apiVersion":"velero.io/v1","kind":"BackupStorageLocation",`+
		`"spec":{"provider":"aws","objectStorage":{"bucket":%q,"prefix":%q},`+
		`"config":{"region":"us-east-1","s3Url":%q,"s3ForcePathStyle":"true"}}}`, bucket, prefix, s3URL))
}

// location opens the repository of bucket as the pods do.
func location(t *testing.T, s3URL, creds, bucket string) *backup.Repository {
	repo, err := mover.Repository(bsl(s3URL, bucket), creds)
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// plainClient is a minio-go client with nothing but the endpoint and the
// keys set, as a user of the library would make it.
func plainClient(t *testing.T, s3URL, creds string) *minio.Client {
	u, err := url.Parse(s3URL)
	if err != nil {
		t.Fatal(err)
	}
	client, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewFileAWSCredentials(creds, "default"),
		Secure: u.Scheme == "https",
	})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// TestChild is the child process's body; it does nothing in a normal run.
// It times its one transfer and reports its own peak RSS (VmHWM: the
// parent cannot use the child's rusage, as Go starts children with vfork
// and ru_maxrss would count the parent's pages too), its CPU time and that
// of the qemu-img processes it ran.
func TestChild(t *testing.T) {
	mode := os.Getenv(envChild)
	if mode == "" {
		t.Skip("child mode only")
	}
	ctx := context.Background()
	s3URL, creds, bucket, file := os.Getenv(envURL), os.Getenv(envCreds), os.Getenv(envBucket), os.Getenv(envFile)
	checkpoint := os.Getenv(envCheckpoint)
	var start time.Time
	switch mode {
	case "plain-put":
		client := plainClient(t, s3URL, creds)
		start = time.Now()
		if _, err := client.FPutObject(ctx, bucket, os.Getenv(envKey), file, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	case "plain-get":
		client := plainClient(t, s3URL, creds)
		start = time.Now()
		if err := client.FGetObject(ctx, bucket, os.Getenv(envKey), file, minio.GetObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	case "upload":
		repo := location(t, s3URL, creds, bucket)
		start = time.Now()
		up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: checkpoint, Type: catalog.Full, Backup: checkpoint})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := up.PutDisk(ctx, "vda", file, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := up.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	case "restore":
		repo := location(t, s3URL, creds, bucket)
		start = time.Now()
		if _, err := repo.Restore(ctx, backup.RestoreOptions{Backup: checkpoint, VM: vm, Disk: "vda",
			Target: file, WorkDir: os.Getenv(envWork)}); err != nil {
			t.Fatal(err)
		}
	case "pod":
		// The pod binary, a child of this small process: its rusage is
		// its own (and its qemu-img's), not the benchmark's.
		var argv []string
		if err := json.Unmarshal([]byte(os.Getenv(envKey)), &argv); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), mover.EnvBSL+"="+string(bsl(s3URL, bucket)),
			"DATAMOVER_TERMINATION_LOG="+filepath.Join(os.Getenv(envWork), "termination-log"))
		start = time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", argv[0], err, out)
		}
		elapsed := time.Since(start)
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		fmt.Printf("ELAPSED-NS %d\nPEAK-RSS-KB %d\nCPU-NS %d\nHELPER-CPU-NS 0\n", elapsed.Nanoseconds(), ru.Maxrss, ru.Utime.Nano()+ru.Stime.Nano())
		return
	default:
		t.Fatalf("unknown child mode %q", mode)
	}
	fmt.Printf("ELAPSED-NS %d\n", time.Since(start).Nanoseconds())
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			fmt.Printf("PEAK-RSS-KB %s\n", strings.Fields(line)[1])
		}
	}
	var self, children syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CPU-NS %d\n", self.Utime.Nano()+self.Stime.Nano())
	fmt.Printf("HELPER-CPU-NS %d\n", children.Utime.Nano()+children.Stime.Nano())
}

// measured is what a child reported, and the CPU time the server spent
// meanwhile.
type measured struct {
	elapsed        time.Duration
	peak           int64
	cpu, helperCPU time.Duration
	serverCPU      time.Duration
}

var childLine = regexp.MustCompile(`(?m)^(ELAPSED-NS|PEAK-RSS-KB|CPU-NS|HELPER-CPU-NS) (\d+)$`)

// child runs one transfer of mode in a new process.
func child(t *testing.T, srv *s3server.Server, creds, bucket, mode, checkpoint, key, file, work string) measured {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+mode, envURL+"="+srv.URL, envCreds+"="+creds,
		envBucket+"="+bucket, envCheckpoint+"="+checkpoint, envKey+"="+key, envFile+"="+file, envWork+"="+work)
	// What the transfer before left dirty in the page cache is written
	// now, not while this one runs: a plain download leaves its file to
	// the kernel's write-back, a restore syncs its target.
	syscall.Sync()
	server := processCPU(t, srv.Pid())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s child: %v: %s", mode, err, out)
	}
	m := measured{serverCPU: processCPU(t, srv.Pid()) - server}
	found := 0
	for _, g := range childLine.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseInt(g[2], 10, 64)
		switch g[1] {
		case "ELAPSED-NS":
			m.elapsed = time.Duration(v)
		case "PEAK-RSS-KB":
			m.peak = v * 1024
		case "CPU-NS":
			m.cpu = time.Duration(v)
		case "HELPER-CPU-NS":
			m.helperCPU = time.Duration(v)
		}
		found++
	}
	if found < 4 {
		t.Fatalf("%s child reported no time, peak RSS or CPU: %s", mode, out)
	}
	return m
}

// processCPU is the user and system time process pid has used so far.
func processCPU(t *testing.T, pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which may hold spaces: state is
	// the first, utime and stime the 12th and 13th (in clock ticks,
	// 100 a second on Linux).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr []byte
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr)
	}
	return out
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / float64(mib) / d.Seconds() }

// randomQcow2 makes a qcow2 file of size virtual bytes with every cluster
// allocated and holding random bytes: nothing to skip, nothing to
// compress. The data goes straight into the clusters qemu-img allocated,
// so the disk is never held twice.
func randomQcow2(t *testing.T, path string, size int64, seed uint64) {
	t.Helper()
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", path, strconv.FormatInt(size, 10))
	var extents []struct {
		Start, Length, Offset int64
		Data                  bool
	}
	if err := json.Unmarshal(run(t, "qemu-img", "map", "--output=json", "-f", "qcow2", path), &extents); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seedBytes [32]byte
	seedBytes[0] = byte(seed)
	rng := rand.NewChaCha8(seedBytes)
	buf := make([]byte, 4*mib)
	var filled int64
	for _, e := range extents {
		if !e.Data {
			t.Fatalf("%s: extent at %d is not allocated", path, e.Start)
		}
		for off := int64(0); off < e.Length; off += int64(len(buf)) {
			chunk := buf[:min(int64(len(buf)), e.Length-off)]
			_, _ = rng.Read(chunk)
			if _, err := f.WriteAt(chunk, e.Offset+off); err != nil {
				t.Fatal(err)
			}
		}
		filled += e.Length
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if filled != size {
		t.Fatalf("%s: filled %d of %d bytes", path, filled, size)
	}
	run(t, "qemu-img", "check", "-q", "-f", "qcow2", path)
}

func freeBytes(t *testing.T, dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// sideBySide is what moving one disk both ways measured: the fastest
// round of each transfer, and one run of the pod binary each way.
type sideBySide struct {
	size, file                       int64
	plainPut, upload, plainGet, rest measured
	podUpload, podRestore            measured
}

// fastest keeps the quicker of two measures; peak RSS is the larger.
func fastest(a, b measured) measured {
	peak := max(a.peak, b.peak)
	if a.elapsed == 0 || b.elapsed < a.elapsed {
		a = b
	}
	a.peak = peak
	return a
}

// compare moves one random disk of size bytes both ways, plainly and
// ours, rounds times each, then once through the pod binary, in a bucket
// of its own that it removes afterwards. Each round runs the plain
// transfer, then ours. Peak disk use is three times size: the file and
// two copies on the server while an upload completes.
func compare(t *testing.T, srv *s3server.Server, creds, dir, pod string, size int64, rounds int) sideBySide {
	ctx := context.Background()
	bucket := fmt.Sprintf("side-by-side-%dg", size/gib)
	plain := plainClient(t, srv.URL, creds)
	if err := plain.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(filepath.Join(srv.Root, bucket))
	src := filepath.Join(dir, "disk.qcow2")
	randomQcow2(t, src, size, uint64(size/gib))
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	row := sideBySide{size: size, file: st.Size()}
	remove := func(key string) {
		if err := plain.RemoveObject(ctx, bucket, key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Upload. The server never holds more than one object besides the
	// one being written.
	for r := 0; r < rounds; r++ {
		row.plainPut = fastest(row.plainPut, child(t, srv, creds, bucket, "plain-put", "", "plain.qcow2", src, dir))
		remove("plain.qcow2")
		checkpoint := fmt.Sprintf("lib-%d", r)
		row.upload = fastest(row.upload, child(t, srv, creds, bucket, "upload", checkpoint, "", src, dir))
		remove(diskKey(checkpoint))
	}
	// The pod finds the file where KubeVirt leaves it.
	source := filepath.Join(dir, "source")
	staged := filepath.Join(source, "vmi", "checkpoint", "vmb-vda.qcow2")
	if err := os.MkdirAll(filepath.Dir(staged), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(src, staged); err != nil {
		t.Fatal(err)
	}
	up := mover.UploadOptions{VM: vm, Backup: "pod", Checkpoint: "pod", Type: catalog.Full, VMBackup: "vmb",
		Source: source, Disks: []mover.Disk{{Volume: "vda", Name: "vda"}}, Credentials: creds}
	row.podUpload = child(t, srv, creds, bucket, "pod", "", commandLine(t, pod, up.Args()), "", dir)
	_ = os.RemoveAll(source)
	_ = os.Remove(src)

	// Download: the plain client fetches the object the pod stored.
	target := filepath.Join(dir, "restored.raw")
	for r := 0; r < rounds; r++ {
		got := filepath.Join(dir, "plain.download")
		row.plainGet = fastest(row.plainGet, child(t, srv, creds, bucket, "plain-get", "", diskKey("pod"), got, dir))
		_ = os.Remove(got)
		row.rest = fastest(row.rest, child(t, srv, creds, bucket, "restore", "pod", "", target, dir))
		_ = os.Remove(target)
	}
	down := mover.RestoreOptions{VM: vm, Backup: "pod", Disk: "vda", Target: target, WorkDir: dir, Credentials: creds}
	row.podRestore = child(t, srv, creds, bucket, "pod", "", commandLine(t, pod, down.Args()), "", dir)
	_ = os.Remove(target)
	return row
}

func commandLine(t *testing.T, binary string, args []string) string {
	b, err := json.Marshal(append([]string{binary}, args...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// report renders a disk's measures as a table.
func (r sideBySide) report(w io.Writer, rounds int) {
	rate := func(d time.Duration) float64 { return mbps(r.file, d) }
	cpu := func(m measured) string {
		return fmt.Sprintf("%.1f + %.1f + %.1f", m.cpu.Seconds(), m.helperCPU.Seconds(), m.serverCPU.Seconds())
	}
	fmt.Fprintf(w, "\n%d GiB disk of random data (qcow2 file of %.2f GiB); fastest of %d rounds, the pod binary once:\n\n", r.size/gib, float64(r.file)/float64(gib), rounds)
	fmt.Fprintf(w, "| transfer | MiB/s | ours / plain | peak RSS | CPU s: process + its qemu-img + server |\n| --- | --- | --- | --- | --- |\n")
	put, up, podUp := rate(r.plainPut.elapsed), rate(r.upload.elapsed), rate(r.podUpload.elapsed)
	get, rest, podRest := rate(r.plainGet.elapsed), rate(r.rest.elapsed), rate(r.podRestore.elapsed)
	fmt.Fprintf(w, "| plain FPutObject (minio-go defaults) | %.0f | | %d MiB | %s |\n", put, r.plainPut.peak/mib, cpu(r.plainPut))
	fmt.Fprintf(w, "| our upload (Begin, PutDisk, Commit) | %.0f | **%.2f**%s | %d MiB | %s |\n", up, up/put, goal(up/put), r.upload.peak/mib, cpu(r.upload))
	fmt.Fprintf(w, "| the same by the pod binary, datamover-upload upload | %.0f | %.2f | **%d MiB** | %s |\n", podUp, podUp/put, r.podUpload.peak/mib, cpu(r.podUpload))
	fmt.Fprintf(w, "| plain FGetObject (minio-go defaults) | %.0f | | %d MiB | %s |\n", get, r.plainGet.peak/mib, cpu(r.plainGet))
	fmt.Fprintf(w, "| our restore (metadata, then one GET per layer with sha256, written into the target, synced) | %.0f | **%.2f**%s | %d MiB | %s |\n", rest, rest/get, goal(rest/get), r.rest.peak/mib, cpu(r.rest))
	fmt.Fprintf(w, "| the same by the pod binary, datamover-upload restore | %.0f | %.2f | **%d MiB** | %s |\n", podRest, podRest/get, r.podRestore.peak/mib, cpu(r.podRestore))
}

// peaks are the peak RSS of our transfers.
func (r sideBySide) peaks() map[string]int64 {
	return map[string]int64{"upload": r.upload.peak, "restore": r.rest.peak,
		"pod upload": r.podUpload.peak, "pod restore": r.podRestore.peak}
}

func sizes(t *testing.T) []int64 {
	spec := os.Getenv(envSizes)
	if spec == "" {
		spec = "4,8"
	}
	var out []int64
	for _, s := range strings.Split(spec, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want GiB sizes separated by commas", envSizes, spec)
		}
		out = append(out, n*gib)
	}
	return out
}

// server starts the S3 server storing under dir and writes its
// credentials file there.
func server(t *testing.T, dir string) (srv *s3server.Server, creds string) {
	ctx := context.Background()
	bin, err := s3server.Binary(ctx, testenv.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	srv, err = s3server.StartLarge(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Stop()
		if t.Failed() {
			// An S3 error names no cause; the server's log does.
			if log, err := os.ReadFile(srv.Log); err == nil {
				t.Logf("S3 server log:\n%s", tail(string(log), 4096))
			}
		}
	})
	creds, err = srv.WriteCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return srv, creds
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestBackupDataPath measures what incrementals save and what chain
// length costs a restore.
func TestBackupDataPath(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Skip("child")
	}
	ctx := context.Background()
	dir := t.TempDir()
	srv, creds := server(t, dir)
	repo := repository(t, srv.URL, creds, "bench")
	var report strings.Builder
	fmt.Fprintf(&report, "| measure | value |\n| --- | --- |\n")

	// 1. Incremental vs full after a known amount of writes.
	hv, err := backuptest.New(ctx, t.TempDir(), gib)
	if err != nil {
		t.Fatal(err)
	}
	if err := hv.Write(ctx, 0, gib, 0x11); err != nil {
		t.Fatal(err)
	}
	full, err := repo.BackupVM(ctx, catalog.VM{Namespace: "bench", Name: "ratio"}, hv, backup.BackupOptions{Backup: "r1", WorkDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 64; i++ {
		if err := hv.Write(ctx, (i*977%1024)*mib, mib, 0x22); err != nil {
			t.Fatal(err)
		}
	}
	inc, err := repo.BackupVM(ctx, catalog.VM{Namespace: "bench", Name: "ratio"}, hv, backup.BackupOptions{Backup: "r2", WorkDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&report, "| full backup of a filled 1 GiB disk, bytes uploaded | %d |\n", full.Uploaded)
	fmt.Fprintf(&report, "| incremental after 64 MiB of writes (6.25%%), bytes uploaded | %d |\n", inc.Uploaded)
	fmt.Fprintf(&report, "| incremental / full | %.4f (changed / total 0.0625) |\n", float64(inc.Uploaded)/float64(full.Uploaded))
	_ = hv.Cleanup()

	// 2. Restore time against chain length (256 MiB disk, 4 MiB per layer).
	hv, err = backuptest.New(ctx, t.TempDir(), 256*mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := hv.Write(ctx, 0, 256*mib, 0x33); err != nil {
		t.Fatal(err)
	}
	chainVM := catalog.VM{Namespace: "bench", Name: "chain"}
	for layers := 1; layers <= 16; layers++ {
		if layers > 1 {
			if err := hv.Write(ctx, int64(layers)*8*mib, 4*mib, byte(layers)); err != nil {
				t.Fatal(err)
			}
		}
		name := fmt.Sprintf("c%02d", layers)
		if _, err := repo.BackupVM(ctx, chainVM, hv, backup.BackupOptions{Backup: name, WorkDir: dir}); err != nil {
			t.Fatal(err)
		}
		if layers == 1 || layers == 2 || layers == 4 || layers == 8 || layers == 16 {
			start := time.Now()
			target := filepath.Join(dir, "chain.raw")
			if _, err := repo.Restore(ctx, backup.RestoreOptions{Backup: name, VM: chainVM, Disk: "vda", Target: target, WorkDir: dir}); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&report, "| restore of a 256 MiB disk from a chain of %d layers | %.2f s |\n", layers, time.Since(start).Seconds())
			_ = os.Remove(target)
		}
	}
	_ = hv.Cleanup()

	fmt.Println(report.String())
}

// TestSideBySide moves disks of random data with our upload and restore
// and with a plain client, on the same server, each transfer in a process
// of its own.
func TestSideBySide(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Skip("child")
	}
	dir := t.TempDir()
	srv, creds := server(t, dir)
	var err error
	rounds := 2
	if v := os.Getenv(envRounds); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("%s=%q: want a positive number", envRounds, v)
		}
	}
	pod := filepath.Join(dir, "datamover-upload")
	build := exec.Command("go", "build", "-o", pod, "./cmd/datamover-upload")
	build.Dir = testenv.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the pod binary: %v: %s", err, out)
	}
	var report strings.Builder
	for _, size := range sizes(t) {
		// Measured (df every 2 s): three times the size at the peak, the
		// source file, the server's parts and the object it assembles
		// from them (unlinked until complete, so du misses it).
		if free := freeBytes(t, dir); free < 3*size+2*gib {
			t.Errorf("%d GiB disk skipped: %d GiB free in %s, it needs %d", size/gib, free/gib, dir, 3*size/gib+2)
			continue
		}
		r := compare(t, srv, creds, dir, pod, size, rounds)
		r.report(&report, rounds)
		for what, peak := range r.peaks() {
			if peak > maxRSS {
				t.Errorf("%d GiB disk: %s's peak RSS is %d MiB, above %d MiB", size/gib, what, peak/mib, maxRSS/mib)
			}
		}
	}
	fmt.Fprintf(&report, "\nGoal: ours / plain at least %.1f, peak RSS at most %d MiB whatever the disk's size.\n", minRatio, maxRSS/mib)
	fmt.Println(report.String())
}

// goal marks a ratio below minRatio.
func goal(ratio float64) string {
	if ratio < minRatio {
		return " (below " + strconv.FormatFloat(minRatio, 'f', 1, 64) + ")"
	}
	return ""
}
