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

package datamover_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/go-logr/logr"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// standInVolume is the one disk of every test VM.
const standInVolume = "rootdisk"

// kubeVirtStandIn plays KubeVirt executing VirtualMachineBackups in push
// mode — it is not KubeVirt. For each backup of a VM it knows it writes the
// qcow2 file of the VM's disk (whole, or the changes since the tracker's
// checkpoint, from a backuptest.Hypervisor) where KubeVirt puts it on the
// backup's volume, "<pvc>/<vm>/<checkpoint>/<backup>-<volume>.qcow2", then
// reports the backup complete and moves the tracker's checkpoint on.
type kubeVirtStandIn struct {
	c    client.Client
	vols volumes

	mu  sync.Mutex
	vms map[string]*standInVM
}

type standInVM struct {
	hv *backuptest.Hypervisor
	// hold leaves backups of the VM running.
	hold bool
	// failWith fails backups of the VM with this message.
	failWith string
	// corrupt replaces the file written with one that is no image.
	corrupt bool
}

func newKubeVirtStandIn(c client.Client, vols volumes) *kubeVirtStandIn {
	return &kubeVirtStandIn{c: c, vols: vols, vms: map[string]*standInVM{}}
}

func (k *kubeVirtStandIn) add(namespace, name string, hv *backuptest.Hypervisor) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.vms[namespace+"/"+name] = &standInVM{hv: hv}
}

func (k *kubeVirtStandIn) set(namespace, name string, change func(*standInVM)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	change(k.vms[namespace+"/"+name])
}

func (k *kubeVirtStandIn) run(ctx context.Context) {
	everyTick(ctx, "KubeVirt stand-in", k.step)
}

// everyTick runs a stand-in's step every 100 ms until ctx ends.
func everyTick(ctx context.Context, name string, step func(context.Context) error) {
	framework.EveryTick(ctx, name, 100*time.Millisecond, step)
}

func (k *kubeVirtStandIn) step(ctx context.Context) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(kubevirtbackup.VMBackupGVK.GroupVersion().WithKind("VirtualMachineBackupList"))
	if err := k.c.List(ctx, list); err != nil {
		return fmt.Errorf("list VirtualMachineBackups: %w", err)
	}
	for i := range list.Items {
		u := &list.Items[i]
		vmb := &kubevirtbackup.VMBackup{}
		if err := kubevirtbackup.FromUnstructured(u, vmb); err != nil {
			return err
		}
		if failed, _ := vmb.Failed(); failed || vmb.Succeeded() || vmb.DeletionTimestamp != nil {
			continue
		}
		if err := k.execute(ctx, u, vmb); err != nil {
			return fmt.Errorf("VirtualMachineBackup %s/%s: %w", vmb.Namespace, vmb.Name, err)
		}
	}
	return nil
}

func (k *kubeVirtStandIn) execute(ctx context.Context, u *unstructured.Unstructured, vmb *kubevirtbackup.VMBackup) error {
	tu := &unstructured.Unstructured{}
	tu.SetGroupVersionKind(kubevirtbackup.VMBackupTrackerGVK)
	if err := k.c.Get(ctx, client.ObjectKey{Namespace: vmb.Namespace, Name: vmb.Spec.Source.Name}, tu); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	tracker := &kubevirtbackup.VMBackupTracker{}
	if err := kubevirtbackup.FromUnstructured(tu, tracker); err != nil {
		return err
	}
	vmName := tracker.Spec.Source.Name
	k.mu.Lock()
	vm := k.vms[vmb.Namespace+"/"+vmName]
	var hold, corrupt bool
	var failWith string
	if vm != nil {
		hold, failWith, corrupt = vm.hold, vm.failWith, vm.corrupt
	}
	k.mu.Unlock()
	switch {
	case vm == nil:
		return fmt.Errorf("VM %s/%s unknown to the stand-in", vmb.Namespace, vmName)
	case hold:
		return nil
	case failWith != "":
		return k.setStatus(ctx, u, map[string]any{"conditions": []any{condition(kubevirtbackup.ConditionFailed, failWith)}})
	}
	parent := ""
	if !vmb.Spec.ForceFullBackup && tracker.Status != nil && tracker.Status.LatestCheckpoint != nil {
		parent = tracker.Status.LatestCheckpoint.Name
	}
	claimDir, err := k.vols.claimDir(ctx, k.c, vmb.Namespace, vmb.Spec.PVCName)
	if errors.Is(err, errUnbound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("backup claim: %w", err)
	}
	checkpoint := vmb.Name + "-" + time.Now().UTC().Format("2006-01-02_15-04-05")
	dir := filepath.Join(claimDir, vmName, checkpoint)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files, err := vm.hv.Backup(ctx, checkpoint, parent, dir)
	if err != nil {
		return err
	}
	file := filepath.Join(dir, vmb.Name+"-"+standInVolume+".qcow2")
	if err := os.Rename(files[vm.hv.Disk], file); err != nil {
		return err
	}
	if corrupt {
		if err := os.WriteFile(file, []byte("no image"), 0o644); err != nil {
			return err
		}
	}
	typ := kubevirtbackup.BackupTypeFull
	if parent != "" {
		typ = kubevirtbackup.BackupTypeIncremental
	}
	volumes := []any{map[string]any{"volumeName": standInVolume, "diskTarget": "vda"}}
	if err := k.setStatus(ctx, u, map[string]any{
		"type": typ, "checkpointName": checkpoint, "includedVolumes": volumes,
		"conditions": []any{condition(kubevirtbackup.ConditionComplete, "backup completed")},
	}); err != nil {
		return err
	}
	tu.Object["status"] = map[string]any{"latestCheckpoint": map[string]any{
		"name": checkpoint, "creationTime": time.Now().UTC().Format(time.RFC3339), "volumes": volumes}}
	if err := k.c.Status().Update(ctx, tu); err != nil {
		return fmt.Errorf("update tracker: %w", err)
	}
	return nil
}

func (k *kubeVirtStandIn) setStatus(ctx context.Context, u *unstructured.Unstructured, status map[string]any) error {
	u.Object["status"] = status
	if err := k.c.Status().Update(ctx, u); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	return nil
}

func condition(t, msg string) map[string]any {
	return map[string]any{"type": t, "status": "True", "reason": t, "message": msg,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
}

// kubeletStandIn plays the kubelet for the controller's pods — it is not a
// kubelet. It runs a pod's command with the pod binary's own code (package
// mover), its mounts mapped to host directories, and reports the outcome in
// the pod's status with the termination message, as the kubelet would.
type kubeletStandIn struct {
	c    client.Client
	vols volumes
	tmp  string

	mu      sync.Mutex
	started map[string]bool
	// hold leaves pods working for a VM namespace (their DataUpload's
	// source, their DataDownload's target) running without running them.
	hold map[string]bool
	// failWith fails pods working for a VM namespace with this message.
	failWith map[string]string
}

func newKubeletStandIn(c client.Client, vols volumes, tmp string) *kubeletStandIn {
	return &kubeletStandIn{c: c, vols: vols, tmp: tmp, started: map[string]bool{},
		hold: map[string]bool{}, failWith: map[string]string{}}
}

func (k *kubeletStandIn) holdPods(namespace string, hold bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hold[namespace] = hold
}

func (k *kubeletStandIn) failPods(namespace, msg string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failWith[namespace] = msg
}

func (k *kubeletStandIn) run(ctx context.Context) {
	everyTick(ctx, "kubelet stand-in", k.startPods)
}

// startPods starts every datamover pod not started yet.
func (k *kubeletStandIn) startPods(ctx context.Context) error {
	pods := &corev1.PodList{}
	if err := k.c.List(ctx, pods, client.HasLabels{datamover.LabelOwnerKind}); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		key := string(pod.UID)
		k.mu.Lock()
		skip := k.started[key] || pod.DeletionTimestamp != nil || pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending
		k.mu.Unlock()
		if skip {
			continue
		}
		// As a kubelet, start a pod only once its claims are bound.
		if ready, err := k.claimsBound(ctx, pod); err != nil || !ready {
			continue
		}
		vmNamespace, err := k.worksFor(ctx, pod)
		if err != nil {
			return err
		}
		k.mu.Lock()
		k.started[key] = true
		hold, failWith := k.hold[vmNamespace], k.failWith[vmNamespace]
		k.mu.Unlock()
		go k.runPod(ctx, pod.DeepCopy(), hold, failWith)
	}
	return nil
}

// claimsBound reports whether every claim the pod mounts is bound.
func (k *kubeletStandIn) claimsBound(ctx context.Context, pod *corev1.Pod) (bool, error) {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		if _, err := k.vols.claimDir(ctx, k.c, pod.Namespace, v.PersistentVolumeClaim.ClaimName); err != nil {
			return false, client.IgnoreNotFound(err)
		}
	}
	return true, nil
}

// worksFor is the VM namespace a pod works for: its DataUpload's source or
// its DataDownload's target.
func (k *kubeletStandIn) worksFor(ctx context.Context, pod *corev1.Pod) (string, error) {
	namespace, name, _ := strings.Cut(pod.Annotations[datamover.AnnotationOwner], "/")
	key := client.ObjectKey{Namespace: namespace, Name: name}
	switch pod.Labels[datamover.LabelOwnerKind] {
	case datamover.KindDataUpload:
		du := &velerov2.DataUpload{}
		if err := k.c.Get(ctx, key, du); err != nil {
			return "", fmt.Errorf("owner of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return du.Spec.SourceNamespace, nil
	case datamover.KindDataDownload:
		dd := &velerov2.DataDownload{}
		if err := k.c.Get(ctx, key, dd); err != nil {
			return "", fmt.Errorf("owner of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return dd.Spec.TargetVolume.Namespace, nil
	}
	return pod.Namespace, nil
}

func (k *kubeletStandIn) runPod(ctx context.Context, pod *corev1.Pod, hold bool, failWith string) {
	defer GinkgoRecover()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: datamover.PodContainer,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if err := k.c.Status().Update(ctx, pod); err != nil {
		GinkgoWriter.Printf("kubelet stand-in: pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
		return
	}
	if hold {
		return
	}
	msg, err := "", fmt.Errorf("%s", failWith)
	if failWith == "" {
		msg, err = k.execute(ctx, pod)
	}
	phase, code := corev1.PodSucceeded, int32(0)
	if err != nil {
		phase, code, msg = corev1.PodFailed, 1, err.Error()
	}
	pod.Status.Phase = phase
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Message: msg, FinishedAt: metav1.Now()}}
	if err := k.c.Status().Update(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
		GinkgoWriter.Printf("kubelet stand-in: pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
	}
}

// execute runs the pod's command as cmd/datamover-upload does, with every
// path the pod names rewritten to the host directory behind its mount.
func (k *kubeletStandIn) execute(ctx context.Context, pod *corev1.Pod) (string, error) {
	ctr := pod.Spec.Containers[0]
	mounts, err := k.mounts(ctx, pod)
	if err != nil {
		return "", err
	}
	host := func(p string) string {
		best := ""
		for m := range mounts {
			if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		if best == "" {
			return p
		}
		return filepath.Join(mounts[best], strings.TrimPrefix(p, best))
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	getenv := func(k string) string { return env[k] }
	switch ctr.Args[0] {
	case mover.CommandUpload:
		o, err := mover.ParseUpload(ctr.Args[1:], getenv)
		if err != nil {
			return "", err
		}
		o.Source, o.Credentials = host(o.Source), host(o.Credentials)
		repo, err := mover.Repository(o.BSL, o.Credentials)
		if err != nil {
			return "", err
		}
		res, err := mover.Upload(ctx, repo, o, k.progress(ctx, o.Progress, &velerov2.DataUpload{}))
		if err != nil {
			return "", err
		}
		return mover.EncodeResult(res)
	case mover.CommandRestore:
		o, err := mover.ParseRestore(ctr.Args[1:], getenv)
		if err != nil {
			return "", err
		}
		o.Target, o.WorkDir, o.Credentials = host(o.Target), host(o.WorkDir), host(o.Credentials)
		repo, err := mover.Repository(o.BSL, o.Credentials)
		if err != nil {
			return "", err
		}
		res, err := mover.Restore(ctx, repo, o, k.progress(ctx, o.Progress, &velerov2.DataDownload{}))
		if err != nil {
			return "", err
		}
		return mover.EncodeResult(res)
	}
	return "", fmt.Errorf("unknown command %q", ctr.Args[0])
}

// mounts maps the container's mount paths to host directories: a claim's
// directory, a secret's keys written out, an emptyDir.
func (k *kubeletStandIn) mounts(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	sources := map[string]corev1.VolumeSource{}
	for _, v := range pod.Spec.Volumes {
		sources[v.Name] = v.VolumeSource
	}
	out := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		src := sources[m.Name]
		dir := filepath.Join(k.tmp, string(pod.UID), m.Name)
		switch {
		case src.PersistentVolumeClaim != nil:
			var err error
			if dir, err = k.vols.claimDir(ctx, k.c, pod.Namespace, src.PersistentVolumeClaim.ClaimName); err != nil {
				return nil, fmt.Errorf("claim volume %s: %w", m.Name, err)
			}
		case src.Secret != nil:
			secret := &corev1.Secret{}
			if err := k.c.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: src.Secret.SecretName}, secret); err != nil {
				return nil, fmt.Errorf("secret volume %s: %w", m.Name, err)
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, err
			}
			// The keys the volume names, or all of them.
			paths := map[string]string{}
			for _, item := range src.Secret.Items {
				paths[item.Key] = item.Path
			}
			if len(src.Secret.Items) == 0 {
				for key := range secret.Data {
					paths[key] = key
				}
			}
			keys := make([]string, 0, len(paths))
			for key := range paths {
				keys = append(keys, key)
			}
			sort.Strings(keys)
			for _, key := range keys {
				data, ok := secret.Data[key]
				if !ok {
					return nil, fmt.Errorf("secret volume %s: secret %s has no key %q", m.Name, secret.Name, key)
				}
				if err := os.WriteFile(filepath.Join(dir, paths[key]), data, 0o400); err != nil {
					return nil, err
				}
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		out[m.MountPath] = dir
	}
	return out, nil
}

func (k *kubeletStandIn) progress(ctx context.Context, ref mover.ObjectRef, obj client.Object) mover.ProgressFunc {
	obj.SetNamespace(ref.Namespace)
	obj.SetName(ref.Name)
	r := &mover.StatusReporter{Client: k.c, Object: obj, Interval: 200 * time.Millisecond}
	return r.Func(logr.NewContext(ctx, GinkgoLogr.WithName("kubelet stand-in")))
}
