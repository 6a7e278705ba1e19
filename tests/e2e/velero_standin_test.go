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
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// vmBackupStandIn plays the part of KubeVirt v1.9 that executes a
// VirtualMachineBackup in push mode — it is not KubeVirt, which v1.7.0
// has no backup API in. It writes each disk's backup with the VM's own
// running QEMU, driven through the libvirt of the VM's launcher pod:
//
//   - a full backup is libvirt's push backup (virsh backup-begin) of the
//     disk into a new qcow2 file, after a dirty bitmap was added to the
//     disk through libvirt's QEMU monitor;
//   - an incremental backup is QEMU's backup job in sync=incremental mode
//     with that bitmap, which it clears of what it copied, through the
//     same monitor, into a qcow2 file whose backing file names the live
//     disk, as libvirt writes one.
//
// libvirt's own incremental backups need checkpoints, which libvirt keeps
// only in qcow2 disks (KubeVirt v1.9 adds a qcow2 layer for them); a disk
// on a claim is raw in KubeVirt v1.7.0, so the bitmap is QEMU's, in memory,
// lost with the VM's process as KubeVirt's checkpoints need redefining
// then. The file lands where KubeVirt puts it on the backup's claim,
// "<claim>/<vmi>/<checkpoint>/<backup>-<volume>.qcow2", written through
// the node's file of the claim's local volume; then the backup is reported
// complete and the tracker's checkpoint moved on, as KubeVirt reports
// them.
type vmBackupStandIn struct {
	mu sync.Mutex
	// bitmaps is, per launcher pod, the checkpoint its QEMU's bitmap
	// counts changes since.
	bitmaps map[string]string
	// log is what the stand-in did, for the spec's output.
	log []string
}

// standInBitmap is the dirty bitmap's name in QEMU.
const standInBitmap = "kubevirt-qcow2-standin"

// standInDir is where QEMU writes a backup inside the launcher pod: the
// launcher's private directory, writable by its user.
const standInDir = "/var/run/kubevirt-private/standin-backup"

func newVMBackupStandIn() *vmBackupStandIn {
	return &vmBackupStandIn{bitmaps: map[string]string{}}
}

// run executes VirtualMachineBackups until ctx ends.
func (s *vmBackupStandIn) run(ctx context.Context) {
	framework.EveryTick(ctx, "VirtualMachineBackup stand-in", 2*time.Second, s.step)
}

func (s *vmBackupStandIn) step(ctx context.Context) error {
	out, err := kubectl(ctx, "get", "virtualmachinebackups.backup.kubevirt.io", "-A", "-o", "json")
	if err != nil {
		return err
	}
	var list struct {
		Items []kubevirtbackup.VMBackup `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return fmt.Errorf("decode VirtualMachineBackups: %w", err)
	}
	for i := range list.Items {
		vmb := &list.Items[i]
		if failed, _ := vmb.Failed(); failed || vmb.Succeeded() || vmb.DeletionTimestamp != nil {
			continue
		}
		if err := s.execute(ctx, vmb); err != nil {
			return fmt.Errorf("VirtualMachineBackup %s/%s: %w", vmb.Namespace, vmb.Name, err)
		}
	}
	return nil
}

func (s *vmBackupStandIn) execute(ctx context.Context, vmb *kubevirtbackup.VMBackup) error {
	ns := vmb.Namespace
	out, err := kubectl(ctx, "-n", ns, "get", "virtualmachinebackuptrackers.backup.kubevirt.io", vmb.Spec.Source.Name, "-o", "json")
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	tracker := &kubevirtbackup.VMBackupTracker{}
	if err := json.Unmarshal([]byte(out), tracker); err != nil {
		return fmt.Errorf("decode tracker: %w", err)
	}
	vm := tracker.Spec.Source.Name
	// KubeVirt writes once the backup's claim is bound.
	pv, err := kubectl(ctx, "-n", ns, "get", "pvc", vmb.Spec.PVCName, "--ignore-not-found", "-o", "jsonpath={.spec.volumeName}")
	if err != nil {
		return fmt.Errorf("backup claim: %w", err)
	}
	if pv == "" {
		return nil
	}
	claimDir, err := kubectl(ctx, "get", "pv", pv, "-o", "jsonpath={.spec.local.path}")
	if err != nil {
		return fmt.Errorf("backup claim's volume: %w", err)
	}
	if claimDir == "" {
		return fmt.Errorf("volume %s of claim %s is no local volume", pv, vmb.Spec.PVCName)
	}
	pod, err := kubectl(ctx, "-n", ns, "get", "pods", "-l", "vm.kubevirt.io/name="+vm,
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil || pod == "" {
		return fmt.Errorf("no running launcher pod of %s: %w", vm, err)
	}
	l := launcher{namespace: ns, pod: pod, domain: ns + "_" + vm}
	disk, err := l.rootDisk(ctx)
	if err != nil {
		return err
	}

	checkpoint := vmb.Name + "-" + time.Now().UTC().Format("20060102-150405")
	s.mu.Lock()
	since := s.bitmaps[pod]
	s.mu.Unlock()
	parent := tracker.LatestCheckpoint()
	incremental := !vmb.Spec.ForceFullBackup && parent != "" && since == parent
	target := standInDir + "/" + checkpoint + ".qcow2"
	if _, err := l.sh(ctx, "", "rm -rf "+standInDir+" && mkdir -p "+standInDir); err != nil {
		return err
	}
	if incremental {
		err = l.incremental(ctx, disk, target)
	} else {
		err = l.full(ctx, disk, target)
	}
	if err != nil {
		return err
	}
	dir := filepath.Join(claimDir, vm, checkpoint)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	file := filepath.Join(dir, vmb.Name+"-"+disk.volume+".qcow2")
	if err := l.copyOut(ctx, target, file); err != nil {
		return err
	}
	if _, err := l.sh(ctx, "", "rm -rf "+standInDir); err != nil {
		return err
	}
	s.mu.Lock()
	s.bitmaps[pod] = checkpoint
	kind := kubevirtbackup.BackupTypeFull
	if incremental {
		kind = kubevirtbackup.BackupTypeIncremental
	}
	s.log = append(s.log, fmt.Sprintf("%s %s/%s: %s of %s into %s", kind, ns, vmb.Name, checkpoint, disk.volume, file))
	s.mu.Unlock()

	now := time.Now().UTC().Format(time.RFC3339)
	volumes := []map[string]string{{"volumeName": disk.volume, "diskTarget": disk.target}}
	status, _ := json.Marshal(map[string]any{"status": map[string]any{
		"type": kind, "checkpointName": checkpoint, "includedVolumes": volumes,
		"conditions": []any{map[string]any{"type": kubevirtbackup.ConditionComplete, "status": "True",
			"reason": "Completed", "message": "backup completed (test stand-in)", "lastTransitionTime": now}},
	}})
	if _, err := kubectl(ctx, "-n", ns, "patch", "virtualmachinebackups.backup.kubevirt.io", vmb.Name,
		"--subresource=status", "--type=merge", "-p", string(status)); err != nil {
		return err
	}
	status, _ = json.Marshal(map[string]any{"status": map[string]any{
		"latestCheckpoint": map[string]any{"name": checkpoint, "creationTime": now, "volumes": volumes}}})
	_, err = kubectl(ctx, "-n", ns, "patch", "virtualmachinebackuptrackers.backup.kubevirt.io", tracker.Name,
		"--subresource=status", "--type=merge", "-p", string(status))
	return err
}

// launcher is a VM's virt-launcher pod and its domain.
type launcher struct {
	namespace, pod, domain string
}

// launcherDisk is the VM's disk as QEMU has it.
type launcherDisk struct {
	volume, target, source, node string
	size                         int64
}

func (l launcher) virsh(ctx context.Context, args ...string) (string, error) {
	return kubectl(ctx, append([]string{"-n", l.namespace, "exec", l.pod, "-c", "compute", "--",
		"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock"}, args...)...)
}

// qmp runs one QMP command through libvirt's monitor and decodes its
// return value into ret (when not nil).
func (l launcher) qmp(ctx context.Context, ret any, execute string, arguments any) error {
	cmd := map[string]any{"execute": execute}
	if arguments != nil {
		cmd["arguments"] = arguments
	}
	b, _ := json.Marshal(cmd)
	out, err := l.virsh(ctx, "qemu-monitor-command", l.domain, string(b))
	if err != nil {
		return err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Desc string `json:"desc"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		return fmt.Errorf("%s: decode %q: %w", execute, out, err)
	}
	if reply.Error != nil {
		return fmt.Errorf("%s: %s", execute, reply.Error.Desc)
	}
	if ret != nil {
		return json.Unmarshal(reply.Return, ret)
	}
	return nil
}

func (l launcher) sh(ctx context.Context, stdin, script string) (string, error) {
	return kubectlIn(ctx, stdin, "-n", l.namespace, "exec", "-i", l.pod, "-c", "compute", "--", "sh", "-c", script)
}

// rootDisk is the VM's rootdisk volume: its target, the file QEMU opens
// and QEMU's node for it.
func (l launcher) rootDisk(ctx context.Context) (launcherDisk, error) {
	d := launcherDisk{volume: "rootdisk", target: "vda"}
	out, err := l.virsh(ctx, "domblklist", l.domain)
	if err != nil {
		return d, err
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == d.target {
			d.source = f[1]
		}
	}
	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			NodeName string `json:"node-name"`
			Image    struct {
				VirtualSize int64 `json:"virtual-size"`
			} `json:"image"`
		} `json:"inserted"`
	}
	if err := l.qmp(ctx, &blocks, "query-block", nil); err != nil {
		return d, err
	}
	for _, b := range blocks {
		if strings.Contains(b.QDev, "ua-"+d.volume) && b.Inserted != nil {
			d.node, d.size = b.Inserted.NodeName, b.Inserted.Image.VirtualSize
		}
	}
	if d.source == "" || d.node == "" {
		return d, fmt.Errorf("no disk %s in domain %s (%q)", d.target, l.domain, out)
	}
	return d, nil
}

// full starts the bitmap, then runs libvirt's push backup of the whole
// disk into target. The bitmap starts before the backup's point in time:
// the next incremental may copy a few clusters twice, never miss one.
func (l launcher) full(ctx context.Context, d launcherDisk, target string) error {
	_ = l.qmp(ctx, nil, "block-dirty-bitmap-remove", map[string]any{"node": d.node, "name": standInBitmap})
	if err := l.qmp(ctx, nil, "block-dirty-bitmap-add", map[string]any{"node": d.node, "name": standInBitmap, "persistent": false}); err != nil {
		return err
	}
	xml := fmt.Sprintf(`<domainbackup mode='push'><disks>
<disk name='%s' backup='yes' type='file'><driver type='qcow2'/><target file='%s'/></disk>
</disks></domainbackup>`, d.target, target)
	if _, err := l.sh(ctx, xml, "cat > "+standInDir+"/backup.xml"); err != nil {
		return err
	}
	if _, err := l.virsh(ctx, "backup-begin", l.domain, standInDir+"/backup.xml"); err != nil {
		return err
	}
	// The job runs until the active job is None; the completed job's
	// record then says how it ended.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		out, err := l.virsh(ctx, "domjobinfo", l.domain)
		if err == nil && regexp.MustCompile(`Job type:\s+None`).MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("libvirt's backup did not end: %w", err)
			}
			return fmt.Errorf("libvirt's backup did not end: %s", out)
		}
		time.Sleep(time.Second)
	}
	out, err := l.virsh(ctx, "domjobinfo", l.domain, "--completed")
	if err != nil {
		return err
	}
	if !regexp.MustCompile(`Job type:\s+Completed`).MatchString(out) {
		return fmt.Errorf("libvirt's backup did not complete: %s", out)
	}
	return nil
}

// incremental copies what the bitmap marked into a qcow2 file backed by
// the live disk, with QEMU's backup job.
func (l launcher) incremental(ctx context.Context, d launcherDisk, target string) error {
	if _, err := l.sh(ctx, "", fmt.Sprintf("qemu-img create -q -f qcow2 -F raw -b %s -u %s %d", d.source, target, d.size)); err != nil {
		return err
	}
	const node, job = "standin-target", "standin-backup"
	if err := l.qmp(ctx, nil, "blockdev-add", map[string]any{"driver": "qcow2", "node-name": node, "backing": nil,
		"file": map[string]any{"driver": "file", "filename": target}}); err != nil {
		return err
	}
	defer func() { _ = l.qmp(ctx, nil, "blockdev-del", map[string]any{"node-name": node}) }()
	if err := l.qmp(ctx, nil, "blockdev-backup", map[string]any{"job-id": job, "device": d.node, "target": node,
		"sync": "incremental", "bitmap": standInBitmap, "auto-dismiss": false}); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := l.qmp(ctx, &jobs, "query-jobs", nil); err != nil {
			return err
		}
		for _, j := range jobs {
			if j.ID != job || j.Status != "concluded" {
				continue
			}
			if err := l.qmp(ctx, nil, "job-dismiss", map[string]any{"id": job}); err != nil {
				return err
			}
			if j.Error != "" {
				return fmt.Errorf("QEMU's backup job: %s", j.Error)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("QEMU's backup job did not conclude: %+v", jobs)
		}
		time.Sleep(time.Second)
	}
}

// copyOut copies a file of the launcher's compute container to this
// machine.
func (l launcher) copyOut(ctx context.Context, src, dst string) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, kubectlBin, "--kubeconfig", kubeconfig, "-n", l.namespace, "exec", l.pod, "-c", "compute", "--", "cat", src)
	cmd.Stdout = f
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("copy %s out of %s: %w: %s", src, l.pod, err, stderr.String())
	}
	return f.Close()
}
