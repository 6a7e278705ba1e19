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
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

const (
	// veleroNamespace is where `velero install` puts Velero, and where
	// the datamover's pods run.
	veleroNamespace = "velero"
	// veleroBucket and veleroPrefix are the location's.
	veleroBucket = "velero"
	veleroPrefix = "cluster"
	// The images `make images` builds, as the node knows them once
	// imported (IMAGE_REGISTRY and IMAGE_TAG left at their defaults).
	datamoverControllerImage = "kubevirt-qcow2/datamover-controller:dev"
	datamoverImage           = "kubevirt-qcow2/datamover:dev"
	veleroPluginImage        = "kubevirt-qcow2/velero-plugin:dev"
)

// clusterHostIP is the host end of the node's veth, where the node's pods
// reach this machine (hack/cluster.sh's CLUSTER_HOST_IP).
func clusterHostIP() string {
	if ip := os.Getenv("CLUSTER_HOST_IP"); ip != "" {
		return ip
	}
	return "10.99.0.254"
}

// veleroSetup is a Velero installed on the cluster with `velero install`,
// its location on a versitygw of this machine, and the datamover deployed
// from deploy/datamover as docs/install.md tells.
type veleroSetup struct {
	// cli is the velero binary hack/velero.sh built: the CLI of the
	// server that runs.
	cli string
	// veleroVersion and awsVersion are the releases hack/velero.sh built.
	veleroVersion, awsVersion string
	s3                        *s3server.Server
	credentials               string
	cfg                       objectstore.Config
	// datamover is the spec's filled-in copy of deploy/datamover.
	datamover string
}

var metricsArg = regexp.MustCompile(`(?m)^(\s*)- -metrics-bind-address=:8080$`)

var veleroBinDir = regexp.MustCompile(`velero-(v[^-/]+)-aws-(v[^/]+)$`)

// installVelero builds (once, cached) and imports Velero's images, starts
// the S3 server, installs Velero with its AWS plugin and ours as a user
// would, and deploys the datamover. Cleanups uninstall both and stop the
// server.
func installVelero(ctx context.Context) *veleroSetup {
	v := &veleroSetup{}
	out, err := command(ctx, "", filepath.Join(testenv.RepoRoot(), "hack", "velero.sh"))
	Expect(err).ToNot(HaveOccurred())
	m := veleroBinDir.FindStringSubmatch(out)
	Expect(m).ToNot(BeNil(), "hack/velero.sh printed %q", out)
	v.cli, v.veleroVersion, v.awsVersion = filepath.Join(out, "velero"), m[1], m[2]

	var archives []string
	for _, image := range []string{"velero", "velero-plugin-for-aws", "velero-plugin", "datamover-controller", "datamover"} {
		archives = append(archives, filepath.Join(testenv.OutDir(), "images", image+".tar"))
	}
	Expect(run(ctx, clusterScript, append([]string{"import"}, archives...)...)).To(Succeed())

	// What an earlier run that was killed left.
	v.datamover = deployDatamover()
	v.uninstall(ctx)

	binary, err := s3server.Binary(ctx, testenv.RepoRoot())
	Expect(err).ToNot(HaveOccurred())
	dir, err := os.MkdirTemp("", "e2e-velero-s3-")
	Expect(err).ToNot(HaveOccurred())
	v.s3, err = s3server.StartOn(ctx, binary, dir, clusterHostIP())
	Expect(err).ToNot(HaveOccurred())
	DeferCleanup(func() {
		Expect(v.s3.Stop()).To(Succeed())
		Expect(os.RemoveAll(dir)).To(Succeed())
	})
	v.credentials, err = v.s3.WriteCredentials(dir)
	Expect(err).ToNot(HaveOccurred())
	v.cfg = v.s3.Config(veleroBucket, veleroPrefix, v.credentials)
	store, err := objectstore.NewS3(v.cfg)
	Expect(err).ToNot(HaveOccurred())
	Expect(store.CreateBucket(ctx)).To(Succeed())

	By("velero install, with the AWS plugin and ours, the location on versitygw")
	Expect(v.velero(ctx, "install",
		"--provider", "aws",
		"--image", "kubevirt-qcow2/velero:"+v.veleroVersion,
		"--plugins", "kubevirt-qcow2/velero-plugin-for-aws:"+v.awsVersion+","+veleroPluginImage,
		"--bucket", veleroBucket, "--prefix", veleroPrefix,
		"--secret-file", v.credentials,
		"--backup-location-config", "region=us-east-1,s3ForcePathStyle=true,s3Url="+v.s3.URL,
		"--use-volume-snapshots=false",
		"--use-node-agent",
		"--wait")).Error().ToNot(HaveOccurred())
	DeferCleanup(v.uninstall)
	// Velero looks at the DataUploads and DataDownloads of a backup or
	// restore every 10 s by default: each of the specs' backups and
	// restores would wait 5 s on average for nothing.
	Expect(kubectl(ctx, "-n", veleroNamespace, "patch", "deployment", "velero", "--type", "json", "-p",
		`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--item-operation-sync-frequency=2s"}]`)).
		Error().ToNot(HaveOccurred())
	Expect(kubectl(ctx, "-n", veleroNamespace, "rollout", "status", "deployment/velero", "--timeout=3m")).
		Error().ToNot(HaveOccurred())
	// Velero validates a location every minute by default; the specs
	// look for a validation after each step.
	Expect(kubectl(ctx, "-n", veleroNamespace, "patch", "backupstoragelocation", "default", "--type", "merge",
		"-p", `{"spec":{"validationFrequency":"10s"}}`)).Error().ToNot(HaveOccurred())
	v.expectAvailable(ctx, time.Now())

	By("KubeVirt's backup API, from deploy/kubevirt-backup, the state of VMs on " + veleroClass)
	kubevirtDir := deployKubeVirt()
	backupDir := filepath.Join(filepath.Dir(kubevirtDir), "kubevirt-backup")
	Expect(os.CopyFS(backupDir, os.DirFS(filepath.Join(testenv.RepoRoot(), "deploy", "kubevirt-backup")))).To(Succeed())
	applyAsDocumented(ctx, "### KubeVirt's backup API", "deploy/kubevirt-backup", backupDir)
	// The operator's Deployment as deploy/kubevirt has it can roll the
	// components out again: the specs start on a settled KubeVirt.
	waitKubeVirtOn(ctx, patchedImage)
	Expect(kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "merge",
		"-p", `{"spec":{"configuration":{"vmStateStorageClass":"`+veleroClass+`"}}}`)).Error().ToNot(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) {
		Expect(kubectl(ctx, "-n", "kubevirt", "patch", "kubevirt", "kubevirt", "--type", "merge",
			"-p", `{"spec":{"configuration":{"vmStateStorageClass":null}}}`)).Error().ToNot(HaveOccurred())
		applyAsDocumented(ctx, "## Install", "deploy/kubevirt", kubevirtDir)
		waitKubeVirtOn(ctx, patchedImage)
	})

	By("the datamover, from deploy/datamover with our images")
	applyAsDocumented(ctx, "### The data mover", "deploy/datamover", v.datamover)
	Expect(kubectl(ctx, "-n", "kubevirt-datamover", "rollout", "status", "deployment/datamover-controller", "--timeout=3m")).
		Error().ToNot(HaveOccurred())
	return v
}

// deployDatamover copies deploy/datamover and fills it in as
// docs/install.md tells an administrator to: the controller's image in the
// kustomization, the pods' in the Deployment's -image, both as imported;
// and the storage class of the temporary and intermediate volumes, the
// static volumes of veleroClass.
func deployDatamover() string {
	dir := copyDeploy("datamover")
	editFile(filepath.Join(dir, "kustomization.yaml"), func(s string) string {
		return strings.Replace(s, "newName: registry.example.com/kubevirt-qcow2/datamover-controller",
			"newName: "+strings.TrimSuffix(datamoverControllerImage, ":dev"), 1)
	})
	editFile(filepath.Join(dir, "deployment.yaml"), func(s string) string {
		s = strings.Replace(s, "-image=registry.example.com/kubevirt-qcow2/datamover:dev", "-image="+datamoverImage, 1)
		return metricsArg.ReplaceAllString(s, "$0\n${1}- -storage-class="+veleroClass)
	})
	return dir
}

// uninstall removes Velero and the datamover as their documents say.
func (v *veleroSetup) uninstall(ctx context.Context) {
	if out, _ := kubectl(ctx, "get", "namespace", "kubevirt-datamover", "--ignore-not-found", "-o", "name"); out != "" {
		Expect(kubectl(ctx, "delete", "--ignore-not-found", "--wait=true", "-k", v.datamover)).Error().ToNot(HaveOccurred())
	}
	if out, _ := kubectl(ctx, "get", "namespace", veleroNamespace, "--ignore-not-found", "-o", "name"); out != "" {
		Expect(v.velero(ctx, "uninstall", "--force")).Error().ToNot(HaveOccurred())
	}
}

// velero runs Velero's CLI against the cluster.
func (v *veleroSetup) velero(ctx context.Context, args ...string) (string, error) {
	return command(ctx, "", v.cli, append(args, "--kubeconfig", kubeconfig, "--namespace", veleroNamespace)...)
}

// expectAvailable waits for Velero to have validated its location since
// after and found it Available, as the location's status reports it.
func (v *veleroSetup) expectAvailable(ctx context.Context, after time.Time) {
	Eventually(func(g Gomega) {
		out, err := kubectl(ctx, "-n", veleroNamespace, "get", "backupstoragelocation", "default", "-o",
			"jsonpath={.status.phase} {.status.lastValidationTime} {.status.message}")
		g.Expect(err).ToNot(HaveOccurred())
		fields := strings.Fields(out)
		g.Expect(fields).To(HaveLen(2), "the location's phase and last validation: %q", out)
		g.Expect(fields[0]).To(Equal("Available"), "%q", out)
		validated, err := time.Parse(time.RFC3339, fields[1])
		g.Expect(err).ToNot(HaveOccurred())
		g.Expect(validated).To(BeTemporally(">=", after.Truncate(time.Second)), "validated since %s", after)
	}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
}

// expectPhase expects a Velero backup or restore (kind) to have ended
// Completed; otherwise Velero's own account of it, its description and
// log, goes with the failure.
func (v *veleroSetup) expectPhase(ctx context.Context, kind, name string) {
	phase, err := kubectl(ctx, "-n", veleroNamespace, "get", kind+"s.velero.io", name, "-o", "jsonpath={.status.phase}")
	Expect(err).ToNot(HaveOccurred())
	if phase == "Completed" {
		return
	}
	describe, _ := v.velero(ctx, kind, "describe", name, "--details")
	logs, _ := v.velero(ctx, kind, "logs", name)
	var problems []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=error") || strings.Contains(line, "level=warning") {
			problems = append(problems, line)
		}
	}
	Fail(fmt.Sprintf("%s %s is %s:\n%s\nits log's errors and warnings:\n%s", kind, name, phase, describe, strings.Join(problems, "\n")))
}

// veleroClass is the storage class of the volumes the datamover's claims
// bind to: the node has no provisioner for Filesystem volumes, so they are
// static local volumes, made in advance as an administrator without a
// provisioner makes them, which the PV controller binds to the claims of
// the class as they come.
const veleroClass = "velero-e2e-local"

// veleroStorage makes the class and an empty static volume of it of each of
// capacities, writable by the pods' user (107). The PV controller binds a
// claim to the smallest volume that fits.
func veleroStorage(ctx context.Context, capacities ...int64) {
	Expect(apply(ctx, fmt.Sprintf(`
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
reclaimPolicy: Retain
`, veleroClass))).To(Succeed())
	for i, capacity := range capacities {
		name := fmt.Sprintf("velero-pool-%d", i)
		dir := filepath.Join(volumesDir, name)
		Expect(os.RemoveAll(dir)).To(Succeed())
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		Expect(os.Chown(dir, 107, 107)).To(Succeed())
		Expect(kubectl(ctx, "delete", "pv", name, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
		Expect(apply(ctx, staticVolume(name, dir, capacity, ""))).To(Succeed())
	}
}

// staticVolume is a local PersistentVolume of veleroClass on dir, for
// claim (namespace/name) when not empty.
func staticVolume(name, dir string, capacity int64, claim string) string {
	claimRef := ""
	if ns, n, ok := strings.Cut(claim, "/"); ok {
		claimRef = fmt.Sprintf("\n  claimRef: {namespace: %s, name: %s}", ns, n)
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolume
metadata: {name: %[1]s, labels: {e2e: "true"}}
spec:
  capacity: {storage: "%[3]d"}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  volumeMode: Filesystem
  persistentVolumeReclaimPolicy: Retain
  storageClassName: %[4]s
  local: {path: %[2]s}%[5]s
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%[6]s]}]
`, name, dir, capacity, veleroClass, claimRef, nodeName)
}

// veleroVM is a VM in namespace ns booting the Linux test guest from a raw disk
// on a claim of veleroClass, as KubeVirt keeps a disk on a claim
// (disk.img), which grow, when given, may extend beyond the guest's own
// bytes first; it returns the image's path on this machine.
func veleroVM(ctx context.Context, ns, vm string, grow func(image string)) string {
	name := "velero-" + ns + "-" + vm + "-disk"
	dir := filepath.Join(volumesDir, name)
	Expect(os.RemoveAll(dir)).To(Succeed())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	image := copyLinuxGuest(ctx, filepath.Join(dir, "disk.img"))
	if grow != nil {
		grow(image)
	}
	size := 2 * fileSize(image)
	Expect(os.Chown(dir, 107, 107)).To(Succeed())
	Expect(os.Chown(image, 107, 107)).To(Succeed())
	Expect(kubectl(ctx, "delete", "pv", name, "--ignore-not-found", "--wait=true")).Error().ToNot(HaveOccurred())
	Expect(apply(ctx, staticVolume(name, dir, size, ns+"/"+vm+"-disk")+fmt.Sprintf(`
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[1]s-disk, namespace: %[2]s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: %[3]s
  volumeName: %[4]s
  resources: {requests: {storage: "%[5]d"}}
`, vm, ns, veleroClass, name, size))).To(Succeed())
	yaml := strings.Replace(linuxVMYAML(vm, "Halted", "", fmt.Sprintf("persistentVolumeClaim: {claimName: %s-disk}", vm)),
		"namespace: "+namespace, "namespace: "+ns+", labels: {"+cbtLabel+"}", 1)
	Expect(apply(ctx, yaml)).To(Succeed())
	// Started once KubeVirt tracks it: a VM that runs before KubeVirt
	// selects it must restart for its changed blocks to be tracked.
	Eventually(cbtState).WithContext(ctx).WithArguments(ns, vm).WithTimeout(time.Minute).Should(Equal("Initializing"))
	Expect(virtctl(ctx, "-n", ns, "start", vm)).Error().ToNot(HaveOccurred())
	return image
}

// cbtLabel selects a VM for changed block tracking in deploy/kubevirt-backup.
const cbtLabel = "changedBlockTracking: \"true\""

// cbtState is the VM's changed block tracking state.
func cbtState(ctx context.Context, ns, vm string) string {
	out, _ := kubectl(ctx, "-n", ns, "get", "vm", vm, "-o", "jsonpath={.status.changedBlockTracking.state}")
	return out
}

// trackerCheckpoint is the latest checkpoint of the one
// VirtualMachineBackupTracker of namespace ns, as KubeVirt keeps it.
func trackerCheckpoint(ctx context.Context, ns string) string {
	out, err := kubectl(ctx, "-n", ns, "get", "virtualmachinebackuptrackers.backup.kubevirt.io", "-o",
		"jsonpath={range .items[*]}{.metadata.name} {.status.latestCheckpoint.name}{\"\\n\"}{end}")
	Expect(err).ToNot(HaveOccurred())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	Expect(lines).To(HaveLen(1), "trackers: %q", out)
	fmt.Fprintf(GinkgoWriter, "VirtualMachineBackupTracker %s\n", lines[0])
	_, checkpoint, _ := strings.Cut(lines[0], " ")
	return checkpoint
}

// restoredGuest checks that the Linux guest of a restored VM boots on the
// disk of the backup: its second boot, reading back the pieces it had
// published.
func restoredGuest(ctx context.Context, ns, vm string, published int) {
	status := waitLinuxDoneIn(ctx, ns, vm)
	Expect(status.Boot).To(Equal(2))
	Expect(status.Listed).To(Equal(published))
	fmt.Fprintf(GinkgoWriter, "restored guest in %s/%s: boot %d, verified %d/%d pieces it published\n", ns, vm, status.Boot, status.Verified, status.Listed)
}

// restoredDisk checks the disk a restore wrote into the VM's claim while
// its guest runs on it: the claim is bound to the volume the data mover
// restored, whose first MiB, before the guest's file system and with what
// QEMU wrote there before the incremental backup, is the reference's. The
// rest the booted guest changes (its mount count, its boot count): the
// guest checks it (restoredGuest), and the backup itself is compared
// whole.
func restoredDisk(ctx context.Context, ns, vm, reference string) {
	pv, err := kubectl(ctx, "-n", ns, "get", "pvc", vm+"-disk", "-o", "jsonpath={.spec.volumeName}")
	Expect(err).ToNot(HaveOccurred())
	Expect(pv).To(HavePrefix("velero-pool-"), "the claim is bound to the volume the datamover restored")
	dir, err := kubectl(ctx, "get", "pv", pv, "-o", "jsonpath={.spec.local.path}")
	Expect(err).ToNot(HaveOccurred())
	head := func(name string) []byte {
		f, err := os.Open(name)
		Expect(err).ToNot(HaveOccurred())
		defer f.Close()
		data := make([]byte, 1<<20)
		_, err = io.ReadFull(f, data)
		Expect(err).ToNot(HaveOccurred())
		return data
	}
	Expect(bytes.Equal(head(reference), head(filepath.Join(dir, "disk.img")))).To(BeTrue(), "the restored disk's first MiB")
}

// launcher is a VM's virt-launcher pod and its domain.
type launcher struct {
	namespace, pod, domain string
}

func (l launcher) virsh(ctx context.Context, args ...string) (string, error) {
	return kubectl(ctx, append([]string{"-n", l.namespace, "exec", l.pod, "-c", "compute", "--",
		"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock"}, args...)...)
}

// dataUpload is the one DataUpload of a Velero backup.
type dataUpload struct {
	Spec struct {
		DataMover string `json:"datamover"`
	} `json:"spec"`
	Status struct {
		Phase           string            `json:"phase"`
		Message         string            `json:"message"`
		SnapshotID      string            `json:"snapshotID"`
		DataMoverResult map[string]string `json:"dataMoverResult"`
	} `json:"status"`
}

func dataUploadOf(ctx context.Context, backup string) dataUpload {
	out, err := kubectl(ctx, "-n", veleroNamespace, "get", "datauploads.velero.io", "-l", "velero.io/backup-name="+backup, "-o", "json")
	Expect(err).ToNot(HaveOccurred())
	var list struct{ Items []dataUpload }
	Expect(json.Unmarshal([]byte(out), &list)).To(Succeed())
	Expect(list.Items).To(HaveLen(1), "DataUploads of backup %s", backup)
	return list.Items[0]
}

var _ = Describe("a real Velero with the kubevirt data mover", Ordered, Label(veleroLabel, linuxGuestLabel), func() {
	const (
		vmNamespace = "velero-vms"
		vm          = "vm"
	)
	var (
		v *veleroSetup
		// image is the VM's disk on this machine; reference its content
		// when the incremental backup was taken.
		image, reference string
		// what the guest published before the backups
		published int
		// checkpoints of the full and the incremental backup.
		fullCheckpoint string
	)

	BeforeAll(func(ctx SpecContext) {
		if testenv.KubeVirtVersion() == "v1.7.0" {
			Skip("KubeVirt v1.7.0 has no backup API, which the data mover drives")
		}
		v = installVelero(ctx)
		_, err := kubectl(ctx, "create", "namespace", vmNamespace)
		if err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
			Fail(err.Error())
		}
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "delete", "namespace", vmNamespace, "--ignore-not-found", "--wait=true", "--timeout=5m")).
				Error().ToNot(HaveOccurred())
		})
		// Two backups, two restores, the state of the VM and of its two
		// restores, and a spare; then the backups of the faults, of the
		// restored VM's claim, which is as large as the volume it was
		// restored to.
		veleroStorage(ctx, append(slices.Repeat([]int64{1 << 30}, 8), slices.Repeat([]int64{4 << 30}, 9)...)...)
		reference = filepath.Join(GinkgoT().TempDir(), "disk-at-backup.img")
	})

	It("backs up a namespace without VMs to Completed, the location staying Available", func(ctx SpecContext) {
		Expect(kubectl(ctx, "-n", vmNamespace, "create", "configmap", "plain", "--from-literal=key=value")).
			Error().ToNot(HaveOccurred())
		start := time.Now()
		out, err := v.velero(ctx, "backup", "create", "plain", "--include-namespaces", vmNamespace,
			"--data-mover", "kubevirt", "--snapshot-volumes=false", "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "backup", "plain")
		out, err = v.velero(ctx, "backup", "describe", "plain", "--details")
		Expect(err).ToNot(HaveOccurred())
		Expect(out).To(ContainSubstring("v1/ConfigMap"))
		v.expectAvailable(ctx, time.Now())
		fmt.Fprintf(GinkgoWriter, "backup of a plain namespace in %s\n", time.Since(start).Round(time.Second))
	}, SpecTimeout(10*time.Minute))

	It("backs up a running VM with its DataUpload, full then incremental", func(ctx SpecContext) {
		image = veleroVM(ctx, vmNamespace, vm, nil)
		waitVMIReadyIn(ctx, vmNamespace, vm)
		Eventually(cbtState).WithContext(ctx).WithArguments(vmNamespace, vm).WithTimeout(time.Minute).Should(Equal("Enabled"))
		published = len(waitLinuxDoneIn(ctx, vmNamespace, vm).Published)

		By("a full backup")
		start := time.Now()
		out, err := v.velero(ctx, "backup", "create", "vm-full", "--include-namespaces", vmNamespace,
			"--data-mover", "kubevirt", "--snapshot-volumes=false", "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "backup", "vm-full")
		full := dataUploadOf(ctx, "vm-full")
		Expect(full.Spec.DataMover).To(Equal("kubevirt"))
		Expect(full.Status.Phase).To(Equal("Completed"), full.Status.Message)
		Expect(full.Status.SnapshotID).To(Equal("vm-full/" + vmNamespace + "/" + vm))
		Expect(full.Status.DataMoverResult).To(HaveKeyWithValue("type", "full"))
		fullCheckpoint = full.Status.DataMoverResult["checkpoint"]
		Expect(trackerCheckpoint(ctx, vmNamespace)).To(Equal(fullCheckpoint), "KubeVirt's tracker is on the checkpoint the datamover recorded")
		fmt.Fprintf(GinkgoWriter, "full backup in %s: %v\n", time.Since(start).Round(time.Second), full.Status.DataMoverResult)
		v.expectAvailable(ctx, time.Now())

		By("the guest's disk changing through QEMU, then an incremental backup")
		// Between the MBR and the partition, where the guest's file system
		// does not reach.
		l := launcher{namespace: vmNamespace, pod: launcherPodIn(ctx, vmNamespace, vm), domain: vmNamespace + "_" + vm}
		Expect(l.virsh(ctx, "qemu-monitor-command", l.domain, "--hmp", `qemu-io -d ua-rootdisk/virtio-backend "write -P 0x5a 512k 256k"`)).
			To(BeEmpty())
		start = time.Now()
		out, err = v.velero(ctx, "backup", "create", "vm-incremental", "--include-namespaces", vmNamespace,
			"--data-mover", "kubevirt", "--snapshot-volumes=false", "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "backup", "vm-incremental")
		incr := dataUploadOf(ctx, "vm-incremental")
		Expect(incr.Status.Phase).To(Equal("Completed"), incr.Status.Message)
		Expect(incr.Status.DataMoverResult).To(HaveKeyWithValue("type", "incremental"))
		Expect(incr.Status.DataMoverResult).To(HaveKeyWithValue("parent", fullCheckpoint))
		Expect(trackerCheckpoint(ctx, vmNamespace)).To(Equal(incr.Status.DataMoverResult["checkpoint"]))
		fmt.Fprintf(GinkgoWriter, "incremental backup in %s: %v\n", time.Since(start).Round(time.Second), incr.Status.DataMoverResult)
		// 256 KiB written: the incremental file holds those clusters and
		// qcow2's metadata, not the disk.
		Expect(quantity(incr.Status.DataMoverResult["bytesUploaded"])).To(And(
			BeNumerically("<", 1<<20), BeNumerically("<", quantity(full.Status.DataMoverResult["bytesUploaded"]))),
			"the incremental holds the changed clusters only")

		By("the catalog: two complete checkpoints, the second on the first")
		repo, err := backup.Open(v.cfg)
		Expect(err).ToNot(HaveOccurred())
		idx, err := repo.Index(ctx, catalog.VM{Namespace: vmNamespace, Name: vm})
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(2))
		Expect(idx.Checkpoints[0].ID).To(Equal(fullCheckpoint))
		Expect(idx.Checkpoints[1].Type).To(Equal(catalog.Incremental))
		Expect(idx.Checkpoints[1].Parent).To(Equal(fullCheckpoint))
		objects, err := repo.Store.List(ctx, "")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Printf("under %s/:\n", catalog.Root(veleroPrefix))
		for _, o := range objects {
			GinkgoWriter.Printf("  %s (%d bytes)\n", o.Key, o.Size)
		}
		v.expectAvailable(ctx, time.Now())

		// The disk as the incremental backup saw it: the guest writes
		// nothing more, and stopping the VM leaves the file consistent.
		Expect(virtctl(ctx, "-n", vmNamespace, "stop", vm)).Error().ToNot(HaveOccurred())
		Eventually(vmiStatus).WithContext(ctx).WithArguments(vmNamespace, vm).WithTimeout(3 * time.Minute).Should(BeEmpty())
		Expect(exec.CommandContext(ctx, "cp", "--sparse=always", image, reference).Run()).To(Succeed())
	}, SpecTimeout(20*time.Minute))

	It("restores the VM with the disk content it had at the backup", func(ctx SpecContext) {
		Expect(reference).To(BeARegularFile())
		Expect(kubectl(ctx, "-n", vmNamespace, "delete", "vm", vm, "--wait=true", "--timeout=3m")).Error().ToNot(HaveOccurred())
		Expect(kubectl(ctx, "-n", vmNamespace, "delete", "pvc", vm+"-disk", "--wait=true", "--timeout=3m")).Error().ToNot(HaveOccurred())

		By("the backup holding the disk as it was, byte for byte")
		repo, err := backup.Open(v.cfg)
		Expect(err).ToNot(HaveOccurred())
		key := catalog.VM{Namespace: vmNamespace, Name: vm}
		idx, err := repo.Index(ctx, key)
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Checkpoints).ToNot(BeEmpty())
		Expect(idx.Checkpoints[0].Files).To(HaveLen(1))
		fromBackup := filepath.Join(GinkgoT().TempDir(), "disk-from-backup.img")
		_, err = repo.Restore(ctx, backup.RestoreOptions{Backup: "vm-incremental", VM: key,
			Disk: idx.Checkpoints[0].Files[0].DiskName, Target: fromBackup})
		Expect(err).ToNot(HaveOccurred())
		out, err := command(ctx, "", "qemu-img", "compare", "-f", "raw", "-F", "raw", reference, fromBackup)
		Expect(err).ToNot(HaveOccurred(), "qemu-img compare: %s", out)
		Expect(out).To(ContainSubstring("Images are identical"))

		start := time.Now()
		out, err = v.velero(ctx, "restore", "create", "vm-restore", "--from-backup", "vm-incremental", "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "restore", "vm-restore")
		fmt.Fprintf(GinkgoWriter, "restore in %s\n", time.Since(start).Round(time.Second))

		By("the VMI, launcher pod and state claim of the backup left to KubeVirt to make again")
		logs, err := v.velero(ctx, "restore", "logs", "vm-restore")
		Expect(err).ToNot(HaveOccurred())
		Expect(logs).To(And(ContainSubstring("VirtualMachineInstance not restored"), ContainSubstring("Pod not restored"),
			MatchRegexp(`PersistentVolumeClaim persistent-state-for-`+vm+`-\w+ not restored: KubeVirt's persistent state of the VM`)))

		By("the VM running again on its restored claim")
		waitVMIReadyIn(ctx, vmNamespace, vm)
		pods, err := kubectl(ctx, "-n", vmNamespace, "get", "pods", "-l", "kubevirt.io=virt-launcher", "-o", "name")
		Expect(err).ToNot(HaveOccurred())
		Expect(strings.Fields(pods)).To(HaveLen(1), "one launcher pod, virt-controller's")
		restoredDisk(ctx, vmNamespace, vm, reference)
		restoredGuest(ctx, vmNamespace, vm, published)
		v.expectAvailable(ctx, time.Now())
	}, SpecTimeout(20*time.Minute))

	It("restores the VM into another namespace, running, with the same data", func(ctx SpecContext) {
		const copyNamespace = vmNamespace + "-copy"
		DeferCleanup(func(ctx SpecContext) {
			Expect(kubectl(ctx, "delete", "namespace", copyNamespace, "--ignore-not-found", "--wait=true", "--timeout=5m")).
				Error().ToNot(HaveOccurred())
		})
		out, err := v.velero(ctx, "restore", "create", "vm-restore-copy", "--from-backup", "vm-incremental",
			"--namespace-mappings", vmNamespace+":"+copyNamespace, "--wait")
		Expect(err).ToNot(HaveOccurred())
		GinkgoWriter.Println(out)
		v.expectPhase(ctx, "restore", "vm-restore-copy")
		waitVMIReadyIn(ctx, copyNamespace, vm)
		restoredDisk(ctx, copyNamespace, vm, reference)
		restoredGuest(ctx, copyNamespace, vm, published)
		Expect(kubectl(ctx, "delete", "namespace", copyNamespace, "--wait=true", "--timeout=5m")).Error().ToNot(HaveOccurred())
		v.expectAvailable(ctx, time.Now())
	}, SpecTimeout(20*time.Minute))

	It("velero backup delete removes what no remaining backup needs", func(ctx SpecContext) {
		repo, err := backup.Open(v.cfg)
		Expect(err).ToNot(HaveOccurred())
		key := catalog.VM{Namespace: vmNamespace, Name: vm}
		deleteBackup := func(name string) {
			Expect(v.velero(ctx, "backup", "delete", name, "--confirm")).Error().ToNot(HaveOccurred())
			Eventually(func() (string, error) {
				return kubectl(ctx, "-n", veleroNamespace, "get", "backups.velero.io", name, "--ignore-not-found", "-o", "name")
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(BeEmpty())
		}

		By("deleting the full backup: its checkpoint stays, the incremental needs it")
		deleteBackup("vm-full")
		idx, err := repo.Index(ctx, key)
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Checkpoints).To(HaveLen(2))
		Expect(idx.Checkpoints[0].ReferencedBy).To(ConsistOf("vm-incremental"))
		backups, err := repo.Backups(ctx)
		Expect(err).ToNot(HaveOccurred())
		Expect(backupNames(backups)).To(ConsistOf("vm-incremental"))
		v.expectAvailable(ctx, time.Now())

		By("deleting the incremental backup: nothing of the VM's is left but its index")
		deleteBackup("vm-incremental")
		idx, err = repo.Index(ctx, key)
		Expect(err).ToNot(HaveOccurred())
		Expect(idx.Checkpoints).To(BeEmpty())
		backups, err = repo.Backups(ctx)
		Expect(err).ToNot(HaveOccurred())
		Expect(backups).To(BeEmpty())
		objects, err := repo.Store.List(ctx, "")
		Expect(err).ToNot(HaveOccurred())
		var keys []string
		for _, o := range objects {
			keys = append(keys, o.Key)
		}
		Expect(keys).To(ConsistOf(catalog.VMIndexPath(key)),
			"the datamover's objects left")
		v.expectAvailable(ctx, time.Now())
	}, SpecTimeout(10*time.Minute))

	faultBackups(func() *veleroSetup { return v }, vmNamespace, vm)
})

func backupNames(backups []catalog.BackupManifest) []string {
	var names []string
	for _, b := range backups {
		names = append(names, b.BackupName)
	}
	return names
}

// quantity reads a decimal number the DataUpload's result carries.
func quantity(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	Expect(err).ToNot(HaveOccurred(), "number %q", s)
	return n
}
