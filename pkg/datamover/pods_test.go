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
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var _ = Describe("the pods", func() {
	meta := metav1.ObjectMeta{Namespace: "vms", Name: "kubevirt-backup-x"}
	block := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "target"},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: ptr.To(corev1.PersistentVolumeBlock)}}
	keys := &location{secret: secretKey{name: "creds", key: "cloud"}}
	podsFor := func(c *Config, loc *location) map[string]*corev1.Pod {
		c.defaults()
		return map[string]*corev1.Pod{
			"upload":  c.uploadPod(meta, loc, "claim", []string{"upload"}, nil),
			"restore": c.restorePod(meta, loc, block, []string{"restore"}, nil),
		}
	}
	pods := func(c *Config) map[string]*corev1.Pod { return podsFor(c, keys) }

	It("get a service account token where the location's web identity reads it, for the configured audience", func() {
		webIdentity := &location{secret: keys.secret, tokenFile: "/var/run/secrets/openshift/serviceaccount/token"}
		for _, c := range []struct {
			config   *Config
			audience string
		}{{&Config{Image: "datamover"}, "openshift"}, {&Config{Image: "datamover", WebIdentityAudience: "sts.amazonaws.com"}, "sts.amazonaws.com"}} {
			for kind, pod := range podsFor(c.config, webIdentity) {
				Expect(pod.Spec.Volumes).To(ContainElement(corev1.Volume{Name: "web-identity-token", VolumeSource: corev1.VolumeSource{
					Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
						Audience: c.audience, ExpirationSeconds: ptr.To[int64](3600), Path: "token"}}}, DefaultMode: ptr.To[int32](0o400)}}}), kind)
				Expect(pod.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "web-identity-token",
					MountPath: "/var/run/secrets/openshift/serviceaccount", ReadOnly: true}), kind)
			}
		}
		for kind, pod := range pods(&Config{Image: "datamover"}) {
			Expect(pod.Spec.Volumes).NotTo(ContainElement(HaveField("Name", "web-identity-token")), kind)
		}
	})

	It("run as KubeVirt's qemu user with the restricted Pod Security level's settings", func() {
		for kind, pod := range pods(&Config{Image: "datamover"}) {
			sc := pod.Spec.SecurityContext
			Expect(sc).NotTo(BeNil(), kind)
			Expect(sc.RunAsNonRoot).To(HaveValue(BeTrue()), kind)
			Expect(sc.RunAsUser).To(HaveValue(Equal(int64(107))), kind)
			Expect(sc.RunAsGroup).To(HaveValue(Equal(int64(107))), kind)
			Expect(sc.FSGroup).To(HaveValue(Equal(int64(107))), kind)
			Expect(sc.SeccompProfile).To(Equal(&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}), kind)
			Expect(pod.Spec.Containers).To(HaveLen(1))
			csc := pod.Spec.Containers[0].SecurityContext
			Expect(csc).NotTo(BeNil(), kind)
			Expect(csc.AllowPrivilegeEscalation).To(HaveValue(BeFalse()), kind)
			Expect(csc.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()), kind)
			Expect(csc.Capabilities).To(Equal(&corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}), kind)
			Expect(csc.Privileged).To(BeNil(), kind)
			Expect(pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC).To(BeFalse(), kind)
			Expect(pod.Spec.Containers[0].Resources).To(BeZero(), kind)
			Expect(pod.Spec.NodeSelector).To(BeNil(), kind)
			Expect(pod.Spec.Tolerations).To(BeNil(), kind)
		}
	})

	It("take the configured resources, placement and supplemental groups", func() {
		res, err := PodResources{CPURequest: "250m", MemoryRequest: "128Mi", MemoryLimit: "512Mi"}.Requirements()
		Expect(err).NotTo(HaveOccurred())
		sel, err := ParseNodeSelector("node-role.kubernetes.io/backup=,topology.kubernetes.io/zone=eu-1a")
		Expect(err).NotTo(HaveOccurred())
		tol, err := ParseTolerations("dedicated=backup:NoSchedule,maintenance")
		Expect(err).NotTo(HaveOccurred())
		groups, err := ParseGroups("6")
		Expect(err).NotTo(HaveOccurred())
		c := &Config{Image: "datamover", PodResources: res, PodNodeSelector: sel, PodTolerations: tol, PodSupplementalGroups: groups}
		for kind, pod := range pods(c) {
			Expect(pod.Spec.Containers[0].Resources).To(Equal(corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
			}), kind)
			Expect(pod.Spec.NodeSelector).To(Equal(map[string]string{
				"node-role.kubernetes.io/backup": "", "topology.kubernetes.io/zone": "eu-1a"}), kind)
			Expect(pod.Spec.Tolerations).To(Equal([]corev1.Toleration{
				{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "backup", Effect: corev1.TaintEffectNoSchedule},
				{Key: "maintenance", Operator: corev1.TolerationOpExists},
			}), kind)
			Expect(pod.Spec.SecurityContext.SupplementalGroups).To(Equal([]int64{6}), kind)
		}
	})

	DescribeTable("refuse settings that are no such thing, naming them",
		func(parse func() error, message string) {
			Expect(parse()).To(MatchError(ContainSubstring(message)))
		},
		Entry("a quantity that is none", func() error {
			_, err := PodResources{MemoryRequest: "lots"}.Requirements()
			return err
		}, `pod memory-request "lots"`),
		Entry("a request above its limit", func() error {
			_, err := PodResources{CPURequest: "2", CPULimit: "500m"}.Requirements()
			return err
		}, "pod cpu request 2 exceeds its limit 500m"),
		Entry("a zero limit", func() error {
			_, err := PodResources{MemoryLimit: "0"}.Requirements()
			return err
		}, `pod memory-limit "0": want a positive quantity`),
		Entry("a selector without a value", func() error {
			_, err := ParseNodeSelector("backup")
			return err
		}, `node selector "backup": want key=value`),
		Entry("a selector key that is no label key", func() error {
			_, err := ParseNodeSelector("bad key=x")
			return err
		}, `node selector key "bad key"`),
		Entry("an effect that is none", func() error {
			_, err := ParseTolerations("dedicated=backup:Never")
			return err
		}, `toleration "dedicated=backup:Never": effect "Never"`),
		Entry("a toleration without a key", func() error {
			_, err := ParseTolerations("=x:NoSchedule")
			return err
		}, `toleration "=x:NoSchedule": key ""`),
		Entry("a group that is no number", func() error {
			_, err := ParseGroups("disk")
			return err
		}, `group "disk": want a numeric group ID`),
	)
})
