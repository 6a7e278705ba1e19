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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// faultBackups registers the specs of backups that fail on the real
// KubeVirt path, each followed by one that must come out right, of VM vm
// of namespace ns (made when the specs before did not leave it), KubeVirt
// tracking its changed blocks; setup is the installed Velero.
func faultBackups(setup func() *veleroSetup, ns, vm string) {
	Context("when a backup fails", Ordered, func() { backupFaults(setup, ns, vm) })
}

func backupFaults(setup func() *veleroSetup, ns, vm string) {
	var (
		v *veleroSetup
		// last is the checkpoint the store holds last.
		last string
	)

	// next backs the VM up again, which must complete: full, incremental
	// from the store's latest checkpoint, or either.
	next := func(ctx context.Context, name, want string) {
		waitVMIReadyIn(ctx, ns, vm)
		Eventually(cbtState).WithContext(ctx).WithArguments(ns, vm).WithTimeout(time.Minute).Should(Equal("Enabled"))
		start := time.Now()
		out, err := v.velero(ctx, "backup", "create", name, "--include-namespaces", ns,
			"--data-mover", "kubevirt", "--snapshot-volumes=false", "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "backup", name)
		du := dataUploadOf(ctx, name)
		Expect(du.Status.Phase).To(Equal("Completed"), du.Status.Message)
		result := du.Status.DataMoverResult
		switch {
		case want == fullBackup:
			Expect(result).To(HaveKeyWithValue("type", "full"))
		case want == eitherBackup && result["type"] == "full":
		default:
			Expect(result).To(HaveKeyWithValue("type", "incremental"))
			Expect(result).To(HaveKeyWithValue("parent", last))
		}
		Expect(trackerCheckpoint(ctx, ns)).To(Equal(result["checkpoint"]))
		repo, err := backup.Open(v.cfg)
		Expect(err).ToNot(HaveOccurred())
		idx, err := repo.Index(ctx, catalog.VM{Namespace: ns, Name: vm})
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Latest()).ToNot(BeEmpty())
		Expect(idx.Latest()[0].ID).To(Equal(result["checkpoint"]), "the store's latest complete checkpoint")
		last = result["checkpoint"]
		fmt.Fprintf(GinkgoWriter, "backup %s in %s: %v\n", name, time.Since(start).Round(time.Second), result)
	}

	// uploadFailed waits for the backup's DataUpload to fail and checks
	// that it says why.
	uploadFailed := func(ctx context.Context, name string, why OmegaMatcher) {
		Eventually(uploadPhase).WithContext(ctx).WithArguments(name).
			WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Equal("Failed"))
		du := dataUploadOf(ctx, name)
		fmt.Fprintf(GinkgoWriter, "DataUpload of %s: %s\n", name, du.Status.Message)
		Expect(du.Status.Message).To(why)
	}
	// partiallyFailed waits for Velero to end the backup PartiallyFailed
	// and checks that nothing the data mover made is left.
	partiallyFailed := func(ctx context.Context, name string) {
		Eventually(func() (string, error) {
			return kubectl(ctx, "-n", veleroNamespace, "get", "backups.velero.io", name, "-o", "jsonpath={.status.phase}")
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Equal("PartiallyFailed"))
		Eventually(leftovers).WithContext(ctx).WithArguments(ns).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(BeEmpty())
	}

	BeforeAll(func(ctx SpecContext) {
		v = setup()
		if out, _ := kubectl(ctx, "-n", ns, "get", "vm", vm, "--ignore-not-found", "-o", "name"); out == "" {
			veleroVM(ctx, ns, vm, nil)
		}
		waitVMIReadyIn(ctx, ns, vm)
		next(ctx, "fault-base", fullBackup)
	}, NodeTimeout(10*time.Minute))

	It("fails a backup whose volume is too small, saying which, and the next is incremental", func(ctx SpecContext) {
		// A claim of 48Mi binds to the smallest volume that fits: a 64 MiB
		// file system, mounted where the node sees it.
		const name = "velero-small"
		dir := filepath.Join(volumesDir, name)
		image := dir + ".img"
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		Expect(command(ctx, "", "truncate", "-s", "64M", image)).Error().ToNot(HaveOccurred())
		Expect(command(ctx, "", "mkfs.ext4", "-q", image)).Error().ToNot(HaveOccurred())
		Expect(inNode(ctx, "mount", "-o", "loop", image, dir)).Error().ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "delete", "pv", name, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
			Expect(inNode(ctx, "umount", dir)).Error().ToNot(HaveOccurred())
			Expect(os.RemoveAll(dir)).To(Succeed())
			Expect(os.Remove(image)).To(Succeed())
		})
		Expect(inNode(ctx, "chown", "107:107", dir)).Error().ToNot(HaveOccurred())
		Expect(apply(ctx, staticVolume(name, dir, 48<<20, ""))).To(Succeed())
		// Full, so that it cannot fit.
		Expect(kubectl(ctx, "-n", ns, "annotate", "vm", vm, datamover.AnnotationBackupPVCSize+"=48Mi",
			datamover.AnnotationForceFull+"=true")).Error().ToNot(HaveOccurred())

		Expect(v.velero(ctx, "backup", "create", "fault-small", "--include-namespaces", ns,
			"--data-mover", "kubevirt", "--snapshot-volumes=false")).Error().ToNot(HaveOccurred())
		uploadFailed(ctx, "fault-small", And(ContainSubstring("No space left on device"),
			ContainSubstring("is too small; set annotation "+datamover.AnnotationBackupPVCSize+" on VirtualMachine "+ns+"/"+vm)))
		partiallyFailed(ctx, "fault-small")

		Expect(kubectl(ctx, "-n", ns, "annotate", "vm", vm, datamover.AnnotationBackupPVCSize+"-",
			datamover.AnnotationForceFull+"-")).Error().ToNot(HaveOccurred())
		next(ctx, "fault-small-next", incrementalBackup)
	}, SpecTimeout(10*time.Minute))

	It("fails a backup whose store goes away mid-upload, and the next is full", func(ctx SpecContext) {
		// Full, so that the upload takes a while.
		Expect(kubectl(ctx, "-n", ns, "annotate", "vm", vm, datamover.AnnotationForceFull+"=true")).Error().ToNot(HaveOccurred())
		// versitygw keeps the parts of a multipart upload under a directory
		// of its own until the upload completes: a new one with a part in
		// it means the upload pod is sending the disk.
		multipart := filepath.Join(v.s3.Root, veleroBucket, ".sgwtmp", "multipart")
		before := uploadsIn(multipart)
		Expect(v.velero(ctx, "backup", "create", "fault-store", "--include-namespaces", ns,
			"--data-mover", "kubevirt", "--snapshot-volumes=false")).Error().ToNot(HaveOccurred())
		Eventually(func() []string {
			var sending []string
			for _, u := range uploadsIn(multipart) {
				if !slices.Contains(before, u) && partsIn(u) > 0 {
					sending = append(sending, u)
				}
			}
			return sending
		}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
		v.s3.Kill()
		By("the S3 server killed while the upload pod sends the disk")
		Expect(kubectl(ctx, "-n", ns, "annotate", "vm", vm, datamover.AnnotationForceFull+"-")).Error().ToNot(HaveOccurred())
		uploadFailed(ctx, "fault-store", MatchRegexp(`^upload pod \S+ failed: .*connection refused`))
		Expect(v.s3.Restart(ctx)).To(Succeed())
		partiallyFailed(ctx, "fault-store")
		v.expectAvailable(ctx, time.Now())

		By("KubeVirt's checkpoint of the failed backup is not in the store: the chain is broken")
		repo, err := backup.Open(v.cfg)
		Expect(err).ToNot(HaveOccurred())
		idx, err := repo.Index(ctx, catalog.VM{Namespace: ns, Name: vm})
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Latest()[0].ID).To(Equal(last), "the store's latest complete checkpoint")
		failedCheckpoint := trackerCheckpoint(ctx, ns)
		Expect(failedCheckpoint).ToNot(Equal(last))
		if c := idx.Checkpoint(failedCheckpoint); c != nil {
			Expect(c.IsComplete()).To(BeFalse(), "the checkpoint whose upload failed is not trusted")
		}
		next(ctx, "fault-store-next", fullBackup)
	}, SpecTimeout(10*time.Minute))

	It("fails a backup whose virt-launcher is killed, and the next comes out right", func(ctx SpecContext) {
		Expect(v.velero(ctx, "backup", "create", "fault-killed", "--include-namespaces", ns,
			"--data-mover", "kubevirt", "--snapshot-volumes=false")).Error().ToNot(HaveOccurred())
		waitVMBackup(ctx, ns)
		killed := killContainer(ctx, ns, launcherPodIn(ctx, ns, vm), "compute")
		By(fmt.Sprintf("%d processes of the launcher killed", killed))
		uploadFailed(ctx, "fault-killed", Or(
			MatchRegexp(`^VirtualMachine `+ns+`/`+vm+` stopped before its VirtualMachineBackup \S+ ended`),
			MatchRegexp(`^VirtualMachineBackup \S+ failed: VMI`)))
		partiallyFailed(ctx, "fault-killed")
		// The VM starts again by its run strategy; KubeVirt has its
		// checkpoints back before it backs it up again.
		next(ctx, "fault-killed-next", eitherBackup)
	}, SpecTimeout(10*time.Minute))

	It("fails a backup whose VM is stopped, and the next comes out right", func(ctx SpecContext) {
		Expect(v.velero(ctx, "backup", "create", "fault-stopped", "--include-namespaces", ns,
			"--data-mover", "kubevirt", "--snapshot-volumes=false")).Error().ToNot(HaveOccurred())
		waitVMBackup(ctx, ns)
		Expect(virtctl(ctx, "-n", ns, "stop", vm)).Error().ToNot(HaveOccurred())
		uploadFailed(ctx, "fault-stopped", Or(
			MatchRegexp(`^VirtualMachine `+ns+`/`+vm+` stopped before its VirtualMachineBackup \S+ ended`),
			MatchRegexp(`^VirtualMachineBackup \S+ failed: VMI`)))
		partiallyFailed(ctx, "fault-stopped")
		Eventually(vmiStatus).WithContext(ctx).WithArguments(ns, vm).WithTimeout(3 * time.Minute).Should(BeEmpty())
		Expect(virtctl(ctx, "-n", ns, "start", vm)).Error().ToNot(HaveOccurred())
		next(ctx, "fault-stopped-next", eitherBackup)
	}, SpecTimeout(10*time.Minute))
}

// Kinds of backup next expects.
const (
	fullBackup        = "full"
	incrementalBackup = "incremental"
	// eitherBackup is full, or incremental from the store's latest
	// checkpoint: after a VM restarts, which one depends on whether
	// KubeVirt has redefined its checkpoints when the backup is planned.
	eitherBackup = "either"
)

// uploadPhase is the phase of the DataUploads of a Velero backup, none
// before the backup made one.
func uploadPhase(ctx context.Context, backup string) (string, error) {
	return kubectl(ctx, "-n", veleroNamespace, "get", "datauploads.velero.io", "-l", "velero.io/backup-name="+backup,
		"-o", "jsonpath={.items[*].status.phase}")
}

// uploadsIn lists the multipart uploads versitygw holds in dir: a
// directory per object, one per upload in it.
func uploadsIn(dir string) []string {
	uploads, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	return uploads
}

// partsIn counts the parts an upload of uploadsIn received.
func partsIn(upload string) int {
	parts, _ := os.ReadDir(upload)
	return len(parts)
}

// waitVMBackup waits for the VirtualMachineBackup the data mover makes in
// namespace ns, polling briskly: the faults strike while KubeVirt writes.
func waitVMBackup(ctx context.Context, ns string) {
	Eventually(func() (string, error) {
		return kubectl(ctx, "-n", ns, "get", "virtualmachinebackups.backup.kubevirt.io", "-o", "name")
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(100 * time.Millisecond).ShouldNot(BeEmpty())
}

// killContainer kills every process of a pod's container at once, as the
// kernel's OOM killer does, and returns how many it killed.
func killContainer(ctx context.Context, ns, pod, container string) int {
	id, err := kubectl(ctx, "-n", ns, "get", "pod", pod, "-o",
		`jsonpath={.status.containerStatuses[?(@.name=="`+container+`")].containerID}`)
	Expect(err).ToNot(HaveOccurred())
	_, id, _ = strings.Cut(id, "://")
	Expect(id).ToNot(BeEmpty(), "container %s of pod %s/%s", container, ns, pod)
	cgroups, err := filepath.Glob("/proc/[0-9]*/cgroup")
	Expect(err).ToNot(HaveOccurred())
	killed := 0
	for _, f := range cgroups {
		data, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(data), id) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		Expect(err).ToNot(HaveOccurred())
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	Expect(killed).ToNot(BeZero(), "processes of container %s", id)
	return killed
}

// leftovers lists what the data mover makes for a backup and still exists:
// pods and claims in Velero's namespace, the VirtualMachineBackup and its
// claim in the VM's namespace ns.
func leftovers(ctx context.Context, ns string) []string {
	owned := datamover.LabelOwnerKind
	inVelero, err := kubectl(ctx, "-n", veleroNamespace, "get", "pods,pvc", "-l", owned, "-o", "name")
	Expect(err).ToNot(HaveOccurred())
	inVM, err := kubectl(ctx, "-n", ns, "get", "virtualmachinebackups.backup.kubevirt.io,pvc", "-l", owned, "-o", "name")
	Expect(err).ToNot(HaveOccurred())
	return append(strings.Fields(inVelero), strings.Fields(inVM)...)
}
