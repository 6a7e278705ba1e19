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

package datamover

import (
	"path"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Where the pods find what they are given.
const (
	PodBackupDir      = "/var/lib/datamover/backup"
	PodTargetDir      = "/var/lib/datamover/target"
	PodTargetDevice   = "/dev/datamover-target"
	PodWorkDir        = "/var/lib/datamover/work"
	PodCredentialsDir = "/var/run/datamover/credentials"
	// PodTargetFile is the disk image in a file-system target volume, where
	// KubeVirt looks for it.
	PodTargetFile = "disk.img"
	// PodContainer is the pods' only container.
	PodContainer = "datamover"

	volBackup      = "backup"
	volTarget      = "target"
	volWork        = "work"
	volCredentials = "credentials"
	volWebIdentity = "web-identity-token"
)

// DefaultWebIdentityAudience is the audience of OpenShift's tokens for AWS
// STS, as OADP projects them into Velero's pod (EKS's IRSA uses
// sts.amazonaws.com).
const DefaultWebIdentityAudience = "openshift"

// PodUser and PodGroup run the pods: KubeVirt's qemu user and group (107),
// which own what a non-root virt-launcher writes (the backup's files) and
// which KubeVirt and CDI expect to own a disk image (disk.img). The pods
// meet the "restricted" Pod Security level: non-root, no privilege
// escalation, every capability dropped, the runtime's seccomp profile and a
// read-only root file system (they write only to their volumes).
const (
	PodUser  int64 = 107
	PodGroup int64 = 107
)

// Config holds the controllers' settings.
type Config struct {
	// Identity names the controller in status.acceptedByNode.
	Identity string
	// Image holds the pod binary (cmd/datamover-upload) as Command.
	Image           string
	Command         string
	ImagePullPolicy corev1.PullPolicy
	// PodServiceAccount runs the pods under an account of that name in
	// Velero's namespace, where the pods run; it must exist there. With it
	// the pods report progress, which needs "patch" on dataupload/status
	// and datadownload/status there. Empty runs them without an API token
	// and without progress.
	PodServiceAccount string
	// DefaultTimeout applies when spec.operationTimeout is zero.
	DefaultTimeout time.Duration
	// MaxChainLength caps chains unless spec.dataMoverConfig says otherwise;
	// zero means no cap.
	MaxChainLength int
	// StorageClass of the temporary volume; empty means the cluster default.
	StorageClass string
	// MaxVMBackups is how many VirtualMachineBackups of DataUploads run at
	// once, cluster-wide; MaxUploads how many upload pods. Zero is no
	// limit. DataUploads beyond them wait, oldest first, saying so.
	MaxVMBackups int
	MaxUploads   int
	// PollInterval bounds how long the controllers wait for what they do not
	// watch (the location's credentials, the store).
	PollInterval time.Duration
	// PodResources are the requests and limits of the pods' container.
	PodResources corev1.ResourceRequirements
	// PodNodeSelector and PodTolerations place the pods. A pod goes where
	// its claim can be attached: a selector that excludes those nodes
	// leaves it Pending until the operation times out.
	PodNodeSelector map[string]string
	PodTolerations  []corev1.Toleration
	// WebIdentityAudience is the audience of the service account token
	// the pods are given where a location's credentials name a web
	// identity token file: the one the location's STS trusts.
	WebIdentityAudience string
	// PodSupplementalGroups are extra groups of the pods' user, e.g. the
	// group owning block devices on the nodes (disk, 6) where the
	// container runtime keeps a device's owner (see
	// docs/datamover-controller.md).
	PodSupplementalGroups []int64
}

func (c *Config) defaults() {
	if c.Command == "" {
		c.Command = "/usr/bin/datamover-upload"
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 4 * time.Hour
	}
	if c.PollInterval == 0 {
		c.PollInterval = 30 * time.Second
	}
	if c.WebIdentityAudience == "" {
		c.WebIdentityAudience = DefaultWebIdentityAudience
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
}

// credentialsFile is the credentials file inside a pod.
func credentialsFile() string { return path.Join(PodCredentialsDir, defaultCredentialsKey) }

// secretKey names the key of a secret that holds a location's credentials.
type secretKey struct{ name, key string }

// credentialsVolume mounts a location's credentials secret, which lives in
// Velero's namespace beside the pods, as credentialsFile: the credentials
// are never copied into another namespace.
func credentialsVolume(creds secretKey) corev1.Volume {
	return corev1.Volume{Name: volCredentials, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName:  creds.name,
		Items:       []corev1.KeyToPath{{Key: creds.key, Path: defaultCredentialsKey}},
		DefaultMode: ptr.To[int32](0o400)}}}
}

// webIdentityVolume projects a token of the pod's service account, for
// the audience the location's STS trusts, where the location's credentials
// read it (tokenFile); kubelet renews it before it expires.
func (c *Config) webIdentityVolume(tokenFile string) (corev1.Volume, corev1.VolumeMount) {
	return corev1.Volume{Name: volWebIdentity, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: c.WebIdentityAudience, ExpirationSeconds: ptr.To[int64](3600), Path: path.Base(tokenFile)}}},
			DefaultMode: ptr.To[int32](0o400)}}},
		corev1.VolumeMount{Name: volWebIdentity, MountPath: path.Dir(tokenFile), ReadOnly: true}
}

// pod is the common part of upload and restore pods.
func (c *Config) pod(meta metav1.ObjectMeta, loc *location, args []string, env map[string]string) *corev1.Pod {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	var envVars []corev1.EnvVar
	for _, k := range names {
		envVars = append(envVars, corev1.EnvVar{Name: k, Value: env[k]})
	}
	pod := &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ServiceAccountName:           c.PodServiceAccount,
			AutomountServiceAccountToken: ptr.To(c.PodServiceAccount != ""),
			NodeSelector:                 c.PodNodeSelector,
			Tolerations:                  c.PodTolerations,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:        ptr.To(true),
				RunAsUser:           ptr.To(PodUser),
				RunAsGroup:          ptr.To(PodGroup),
				FSGroup:             ptr.To(PodGroup),
				FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
				SupplementalGroups:  c.PodSupplementalGroups,
				SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:                     PodContainer,
				Image:                    c.Image,
				ImagePullPolicy:          c.ImagePullPolicy,
				Command:                  []string{c.Command},
				Args:                     args,
				Env:                      envVars,
				Resources:                c.PodResources,
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: volCredentials, MountPath: PodCredentialsDir, ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{credentialsVolume(loc.secret)},
		},
	}
	if loc.tokenFile != "" {
		volume, mount := c.webIdentityVolume(loc.tokenFile)
		pod.Spec.Volumes = append(pod.Spec.Volumes, volume)
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, mount)
	}
	return pod
}

// uploadPod mounts the temporary volume read-only.
func (c *Config) uploadPod(meta metav1.ObjectMeta, loc *location, claim string, args []string, env map[string]string) *corev1.Pod {
	pod := c.pod(meta, loc, args, env)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: volBackup,
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}})
	ctr := &pod.Spec.Containers[0]
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: volBackup, MountPath: PodBackupDir, ReadOnly: true})
	return pod
}

// restorePod writes into claim target: a block device, or disk.img on a
// file system; the layers are staged in an emptyDir.
func (c *Config) restorePod(meta metav1.ObjectMeta, loc *location, target *corev1.PersistentVolumeClaim, args []string, env map[string]string) *corev1.Pod {
	pod := c.pod(meta, loc, args, env)
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: volTarget, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: target.Name}}},
		corev1.Volume{Name: volWork, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	ctr := &pod.Spec.Containers[0]
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: volWork, MountPath: PodWorkDir})
	if isBlock(target) {
		ctr.VolumeDevices = []corev1.VolumeDevice{{Name: volTarget, DevicePath: PodTargetDevice}}
	} else {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: volTarget, MountPath: PodTargetDir})
	}
	return pod
}

func isBlock(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock
}

// restoreTarget is where a restore pod writes the disk.
func restoreTarget(pvc *corev1.PersistentVolumeClaim) string {
	if isBlock(pvc) {
		return PodTargetDevice
	}
	return path.Join(PodTargetDir, PodTargetFile)
}

// podOutcome reads a finished pod's container: its termination message
// and whether it succeeded.
func podOutcome(pod *corev1.Pod) (finished, succeeded bool, message string) {
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		finished, succeeded = true, true
	case corev1.PodFailed:
		finished = true
	default:
		return false, false, ""
	}
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == PodContainer && s.State.Terminated != nil {
			message = s.State.Terminated.Message
			if message == "" {
				message = s.State.Terminated.Reason
			}
		}
	}
	if message == "" {
		message = pod.Status.Message
	}
	return finished, succeeded, message
}
