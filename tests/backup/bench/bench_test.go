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
// the bytes an incremental uploads against a full backup, upload and restore
// throughput against a plain copy of the same bytes, restore time against
// chain length, and the peak memory of uploading and restoring a 4 GiB disk.
// Run by `make bench` only (build tag "bench"); it prints a Markdown report.
package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// Environment of the child process that uploads or restores, so its peak
// RSS is its own.
const (
	envChild = "BACKUP_BENCH_CHILD"
	envURL   = "BACKUP_BENCH_S3_URL"
	envCreds = "BACKUP_BENCH_CREDENTIALS"
	envFile  = "BACKUP_BENCH_FILE"
	envWork  = "BACKUP_BENCH_WORK"
)

var vm = catalog.VM{Namespace: "bench", Name: "vm"}

func repository(t *testing.T, url, creds string) *backup.Repository {
	store, err := objectstore.NewS3(objectstore.Config{Bucket: "bench", S3URL: url, S3ForcePathStyle: true, CredentialsFile: creds})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateBucket(context.Background()); err != nil {
		t.Fatal(err)
	}
	return backup.NewRepository(store)
}

// TestChild is the child process's body; it does nothing in a normal run.
func TestChild(t *testing.T) {
	mode := os.Getenv(envChild)
	if mode == "" {
		t.Skip("child mode only")
	}
	ctx := context.Background()
	repo := repository(t, os.Getenv(envURL), os.Getenv(envCreds))
	switch mode {
	case "upload":
		up, err := repo.Begin(ctx, vm, backup.CheckpointSpec{ID: "big", Type: catalog.Full, Backup: "big"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := up.PutDisk(ctx, "vda", os.Getenv(envFile), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := up.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	case "restore":
		if _, err := repo.Restore(ctx, backup.RestoreOptions{Backup: "big", VM: vm, Disk: "vda",
			Target: os.Getenv(envFile), WorkDir: os.Getenv(envWork)}); err != nil {
			t.Fatal(err)
		}
	}
	// The parent cannot use its rusage: Go starts children with vfork, so
	// ru_maxrss would count the parent's pages too. VmHWM is this process's.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			fmt.Printf("PEAK-RSS-KB %s\n", strings.Fields(line)[1])
		}
	}
}

// child runs TestChild in a new process and returns its wall time and
// peak RSS.
func child(t *testing.T, srv *s3server.Server, creds, mode, file, work string) (time.Duration, int64) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+mode, envURL+"="+srv.URL, envCreds+"="+creds, envFile+"="+file, envWork+"="+work)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s child: %v: %s", mode, err, out)
	}
	elapsed := time.Since(start)
	m := peakRSS.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s child reported no peak RSS: %s", mode, out)
	}
	kb, _ := strconv.ParseInt(m[1], 10, 64)
	return elapsed, kb * 1024
}

var peakRSS = regexp.MustCompile(`PEAK-RSS-KB (\d+)`)

func run(t *testing.T, name string, args ...string) time.Duration {
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return time.Since(start)
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / float64(mib) / d.Seconds() }

func TestBackupDataPath(t *testing.T) {
	if os.Getenv(envChild) != "" {
		t.Skip("child")
	}
	ctx := context.Background()
	dir := t.TempDir()
	bin, err := s3server.Binary(ctx, testenv.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := s3server.Start(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop() //nolint:errcheck // the benchmark is over; a failed stop changes no result
	creds, err := srv.WriteCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	repo := repository(t, srv.URL, creds)
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

	// 3. 4 GiB: throughput against a plain copy, and peak RSS.
	hv, err = backuptest.New(ctx, t.TempDir(), 4*gib)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < 4*gib; off += gib {
		if err := hv.Write(ctx, off, gib, byte(0x40+off/gib)); err != nil {
			t.Fatal(err)
		}
	}
	big := filepath.Join(dir, "big.qcow2")
	run(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", hv.Live(), big)
	_ = hv.Cleanup()
	st, err := os.Stat(big)
	if err != nil {
		t.Fatal(err)
	}
	copyTime := run(t, "cp", big, filepath.Join(dir, "big.copy"))
	_ = os.Remove(filepath.Join(dir, "big.copy"))
	upTime, upRSS := child(t, srv, creds, "upload", big, dir)
	_ = os.Remove(big)
	target := filepath.Join(dir, "big.restored.raw")
	downTime, downRSS := child(t, srv, creds, "restore", target, dir)
	fmt.Fprintf(&report, "| plain copy (cp) of the 4 GiB qcow2 file | %.0f MiB/s |\n", mbps(st.Size(), copyTime))
	fmt.Fprintf(&report, "| upload of the 4 GiB qcow2 file (hash + multipart PUT) | %.0f MiB/s |\n", mbps(st.Size(), upTime))
	fmt.Fprintf(&report, "| restore of it (download + sha256 + check + convert to raw + compare) | %.0f MiB/s |\n", mbps(st.Size(), downTime))
	fmt.Fprintf(&report, "| peak RSS uploading 4 GiB | %d MiB |\n", upRSS/mib)
	fmt.Fprintf(&report, "| peak RSS restoring 4 GiB | %d MiB |\n", downRSS/mib)
	fmt.Println(report.String())
	if upRSS > 256*mib || downRSS > 256*mib {
		t.Errorf("peak RSS above 256 MiB: upload %d MiB, restore %d MiB", upRSS/mib, downRSS/mib)
	}
}
