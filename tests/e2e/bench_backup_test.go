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

package e2e_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
)

// The backup benchmark of `make bench-e2e`: a running VM's disk claim
// backed up full, then incremental once QEMU wrote benchChange bytes of
// random data into it, by the kubevirt data mover (KubeVirt's
// VirtualMachineBackup and its changed block tracking) and by Velero's
// file-system backup (kopia, its node-agent) of the same claim, taking
// turns in one run: how long each Velero backup took, how long its
// DataUpload or PodVolumeBackup took of that, and what it added to the
// bucket. Twice: with the guest's own data only, and with a GiB of random
// data more on the disk, which kopia reads again at every backup and
// changed block tracking does not.

const (
	benchChange = 32 << 20
	// benchCluster is the granularity of KubeVirt's incremental backups,
	// the qcow2 cluster of its files.
	benchCluster = 64 << 10
)

var _ = Describe("backup of a running VM's disk", Label("bench", veleroLabel, linuxGuestLabel), Ordered, func() {
	var v *veleroSetup

	BeforeAll(func(ctx SpecContext) {
		if testenv.KubeVirtVersion() == "v1.7.0" {
			Skip("KubeVirt v1.7.0 has no backup API, which the data mover drives")
		}
		v = installVelero(ctx)
		// Per disk: two backups by the data mover and the VM's state; and
		// a spare.
		veleroStorage(ctx, slices.Repeat([]int64{8 << 30}, 7)...)
	})

	DescribeTable("compares the kubevirt data mover with Velero's file-system backup, full then incremental",
		func(ctx SpecContext, ns string, data int64) {
			const vm = "vm"
			Expect(kubectl(ctx, "create", "namespace", ns)).Error().ToNot(HaveOccurred())
			DeferCleanup(func(ctx SpecContext) {
				Expect(kubectl(ctx, "delete", "namespace", ns, "--wait=true", "--timeout=5m")).Error().ToNot(HaveOccurred())
			})
			// After the guest's own bytes: data bytes of random data, then
			// room for the change.
			var change int64
			veleroVM(ctx, ns, vm, func(image string) {
				guest := fileSize(image)
				if data > 0 {
					Expect(command(ctx, "", "dd", "if=/dev/urandom", "of="+image, "bs=1M", "conv=notrunc", "status=none",
						fmt.Sprintf("seek=%d", guest>>20), fmt.Sprintf("count=%d", data>>20))).Error().ToNot(HaveOccurred())
				}
				change = guest + data
				Expect(os.Truncate(image, change+2*benchChange)).To(Succeed())
			})
			waitVMIReadyIn(ctx, ns, vm)
			Eventually(cbtState).WithContext(ctx).WithArguments(ns, vm).WithTimeout(time.Minute).Should(Equal("Enabled"))
			// Its disk still from then on: the guest remounts it read-only.
			waitLinuxDoneIn(ctx, ns, vm)
			disk, err := kubectl(ctx, "-n", ns, "get", "pvc", vm+"-disk", "-o", "jsonpath={.status.capacity.storage}")
			Expect(err).ToNot(HaveOccurred())

			var mover, kopia []backupSample
			pod := launcherPodIn(ctx, ns, vm)
			round := func(kind string) {
				name := fmt.Sprintf("%s-datamover-%s", ns, kind)
				mover = append(mover, benchBackup(ctx, v, name, "datauploads", "--include-namespaces", ns,
					"--data-mover", "kubevirt", "--snapshot-volumes=false"))
				Expect(dataUploadOf(ctx, name).Status.DataMoverResult).To(HaveKeyWithValue("type", kind))

				// Velero's file-system backup of the volume, opted in on the
				// VM's pod for this backup only.
				Expect(kubectl(ctx, "-n", ns, "annotate", "pod", pod, "backup.velero.io/backup-volumes=rootdisk")).Error().ToNot(HaveOccurred())
				kopia = append(kopia, benchBackup(ctx, v, fmt.Sprintf("%s-kopia-%s", ns, kind), "podvolumebackups",
					"--include-namespaces", ns, "--snapshot-volumes=false"))
				Expect(kubectl(ctx, "-n", ns, "annotate", "pod", pod, "backup.velero.io/backup-volumes-")).Error().ToNot(HaveOccurred())
			}

			round("full")
			By(fmt.Sprintf("QEMU writing %d MiB of random data at %d", benchChange>>20, change))
			Expect(kubectl(ctx, "-n", ns, "exec", pod, "-c", "compute", "--", "dd", "if=/dev/urandom", "of=/tmp/bench-change",
				"bs=1M", fmt.Sprintf("count=%d", benchChange>>20), "status=none")).Error().ToNot(HaveOccurred())
			l := launcher{namespace: ns, pod: pod, domain: ns + "_" + vm}
			Expect(l.virsh(ctx, "qemu-monitor-command", l.domain, "--hmp",
				fmt.Sprintf(`qemu-io -d ua-rootdisk/virtio-backend "write -s /tmp/bench-change %d %d"`, change, benchChange))).To(BeEmpty())
			round("incremental")

			changed := (change+benchChange+benchCluster-1)/benchCluster*benchCluster - change/benchCluster*benchCluster
			fmt.Printf("\nbackup of a running VM's disk on a %s claim holding %d MiB of data, then of %d MiB changed (%d clusters of %d KiB);\n"+
				"times: the Velero backup's, and of that its DataUpload's or PodVolumeBackup's\n",
				disk, change>>20, benchChange>>20, changed/benchCluster, benchCluster>>10)
			fmt.Printf("%-26s %16s %12s %16s %12s %16s\n", "", "full", "full bytes", "incremental", "incr. bytes", "incr. / changed")
			for _, row := range []struct {
				name    string
				samples []backupSample
			}{{"kubevirt data mover", mover}, {"Velero fs-backup (kopia)", kopia}} {
				full, incr := row.samples[0], row.samples[1]
				fmt.Printf("%-26s %16s %12d %16s %12d %15.2fx\n", row.name, full.times(), full.bytes,
					incr.times(), incr.bytes, float64(incr.bytes)/float64(changed))
			}
			fmt.Printf("%-26s %15.2fx %12s %15.2fx\n", "data mover / kopia", float64(mover[0].took)/float64(kopia[0].took), "",
				float64(mover[1].took)/float64(kopia[1].took))
			Expect(mover[1].bytes).To(BeNumerically("<=", changed*11/10), "an incremental holds the changed clusters and little more")
		},
		Entry("the guest's own data", "bench-backup-small", int64(0), SpecTimeout(30*time.Minute)),
		Entry("a GiB of data more", "bench-backup-large", int64(1<<30), SpecTimeout(30*time.Minute)))
})

// backupSample is one Velero backup of the benchmark: how long Velero
// took, how long the DataUpload or PodVolumeBackup did, the bytes it
// added to the bucket.
type backupSample struct {
	took, own time.Duration
	bytes     int64
}

func (s backupSample) times() string {
	return fmt.Sprintf("%s / %s", s.took.Round(100*time.Millisecond), s.own)
}

// benchBackup runs a Velero backup to Completed and samples it; its one
// DataUpload or PodVolumeBackup (resource) says how long it took itself,
// to the second of its timestamps.
func benchBackup(ctx context.Context, v *veleroSetup, name, resource string, args ...string) backupSample {
	before := bucketUse(v)
	start := time.Now()
	Expect(v.velero(ctx, append([]string{"backup", "create", name, "--wait"}, args...)...)).Error().ToNot(HaveOccurred())
	s := backupSample{took: time.Since(start)}
	v.expectPhase(ctx, "backup", name)
	out, err := kubectl(ctx, "-n", veleroNamespace, "get", resource+".velero.io", "-l", "velero.io/backup-name="+name, "-o",
		"jsonpath={range .items[*]}{.status.phase} {.metadata.creationTimestamp} {.status.completionTimestamp}{end}")
	Expect(err).ToNot(HaveOccurred())
	fields := strings.Fields(out)
	Expect(fields).To(HaveLen(3), "the one %s of backup %s", resource, name)
	Expect(fields[0]).To(Equal("Completed"), "the %s of backup %s", resource, name)
	created, err := time.Parse(time.RFC3339, fields[1])
	Expect(err).ToNot(HaveOccurred())
	completed, err := time.Parse(time.RFC3339, fields[2])
	Expect(err).ToNot(HaveOccurred())
	s.own = completed.Sub(created)
	if resource == "datauploads" {
		// Where a DataUpload's time goes: its events, from its creation.
		du, err := kubectl(ctx, "-n", veleroNamespace, "get", "datauploads.velero.io", "-l", "velero.io/backup-name="+name,
			"-o", "jsonpath={.items[0].metadata.name}")
		Expect(err).ToNot(HaveOccurred())
		events, err := kubectl(ctx, "-n", veleroNamespace, "get", "events", "--field-selector", "involvedObject.name="+du,
			"--sort-by", ".lastTimestamp", "-o", "jsonpath={range .items[*]}{.lastTimestamp} {.reason}{\"\\n\"}{end}")
		Expect(err).ToNot(HaveOccurred())
		for _, line := range strings.Split(strings.TrimSpace(events), "\n") {
			at, reason, _ := strings.Cut(line, " ")
			if t, err := time.Parse(time.RFC3339, at); err == nil {
				fmt.Fprintf(GinkgoWriter, "%s: +%s %s\n", du, t.Sub(created), reason)
			}
		}
	}
	after := bucketUse(v)
	if resource == "datauploads" {
		s.bytes = after.mover - before.mover
	} else {
		s.bytes = after.kopia - before.kopia
	}
	return s
}

// bucketUsage is what the bucket holds of each kind of backup: the data
// mover's objects and Velero's kopia repositories.
type bucketUsage struct{ mover, kopia int64 }

// bucketUse sums the sizes of the objects in the S3 server's bucket as its
// files hold them, leaving out its uploads in progress.
func bucketUse(v *veleroSetup) bucketUsage {
	var u bucketUsage
	bucket := filepath.Join(v.s3.Root, veleroBucket)
	moverRoot := filepath.Join(bucket, catalog.Root(veleroPrefix)) + "/"
	kopiaRoot := filepath.Join(bucket, veleroPrefix, "kopia") + "/"
	Expect(filepath.WalkDir(bucket, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(path, moverRoot):
			u.mover += info.Size()
		case strings.HasPrefix(path, kopiaRoot):
			u.kopia += info.Size()
		}
		return nil
	})).To(Succeed())
	return u
}
