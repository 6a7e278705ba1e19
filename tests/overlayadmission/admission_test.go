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

package overlayadmission_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// volume is a VMI volume as a user writes it.
type volume map[string]any

func overlayVolume(name string, overlay map[string]any) volume {
	return volume{"name": name, "overlay": overlay}
}

func claim(name string) map[string]any { return map[string]any{"claimName": name} }

func hostPath(path string) map[string]any { return map[string]any{"path": path} }

// vmiSpec is a complete VMI spec with a virtio disk for every volume. It
// carries the architecture that virt-api's mutating webhook, not served
// here, would set.
func vmiSpec(volumes ...volume) map[string]any {
	disks := make([]any, 0, len(volumes))
	vols := make([]any, 0, len(volumes))
	for _, v := range volumes {
		disks = append(disks, map[string]any{"name": v["name"], "disk": map[string]any{"bus": "virtio"}})
		vols = append(vols, map[string]any(v))
	}
	return map[string]any{
		"architecture": "amd64",
		"domain": map[string]any{
			"devices":   map[string]any{"disks": disks},
			"resources": map[string]any{"requests": map[string]any{"memory": "128Mi"}},
		},
		"volumes": vols,
	}
}

func newVMI(volumes ...volume) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachineInstance",
		"metadata":   map[string]any{"generateName": "overlay-"},
		"spec":       vmiSpec(volumes...),
	}}
}

// owner is the name of the VMIs and VMs whose target directories lie
// under targetPrefixes, <prefix>/<namespace>/<name>/<volume>.
const owner = "vm1"

// named gives obj the name owner instead of a generated one.
func named(obj *unstructured.Unstructured) *unstructured.Unstructured {
	obj.SetGenerateName("")
	obj.SetName(owner)
	return obj
}

func newVM(volumes ...volume) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1",
		"kind":       "VirtualMachine",
		"metadata":   map[string]any{"generateName": "overlay-"},
		"spec": map[string]any{
			"runStrategy": "Halted",
			"template":    map[string]any{"spec": vmiSpec(volumes...)},
		},
	}}
}

// create creates obj for real; what was created is deleted after the spec.
func create(resource schema.GroupVersionResource, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	resources := client.Resource(resource).Namespace(testNamespace)
	created, err := resources.Create(context.Background(), obj, metav1.CreateOptions{})
	if err == nil {
		DeferCleanup(func(ctx SpecContext) {
			Expect(resources.Delete(ctx, created.GetName(), metav1.DeleteOptions{})).To(Succeed())
		})
	}
	return created, err
}

// dryRun sends obj through admission without keeping it.
func dryRun(resource schema.GroupVersionResource, obj *unstructured.Unstructured) error {
	_, err := client.Resource(resource).Namespace(testNamespace).Create(context.Background(), obj,
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// refusedBy matches an error with which the named webhook denied a request,
// with a cause naming field whose message contains message.
func refusedBy(webhook, field, message string) OmegaMatcher {
	return WithTransform(func(err error) (string, error) {
		var status apierrors.APIStatus
		if !errors.As(err, &status) {
			return "", fmt.Errorf("not an API status error: %w", err)
		}
		s := status.Status()
		if !strings.Contains(s.Message, fmt.Sprintf("admission webhook %q denied the request", webhook)) {
			return "", fmt.Errorf("not denied by %s: %s", webhook, s.Message)
		}
		if s.Details == nil {
			return "", fmt.Errorf("no causes: %s", s.Message)
		}
		for _, cause := range s.Details.Causes {
			if cause.Field == field {
				return cause.Message, nil
			}
		}
		return "", fmt.Errorf("no cause names %s: %+v", field, s.Details.Causes)
	}, And(ContainSubstring(field), ContainSubstring(message)))
}

var validOverlays = []TableEntry{
	Entry("ephemeral, over a claim, raw by default", map[string]any{
		"backingPVC": claim("golden-fedora"),
	}),
	Entry("ephemeral, over a host path, qcow2", map[string]any{
		"backingHostPath": hostPath("/var/lib/images/fedora.qcow2"),
		"backingFormat":   "qcow2",
		"persistent":      false,
	}),
	Entry("persistent, claim over claim, raw", map[string]any{
		"backingPVC":    claim("golden-fedora"),
		"backingFormat": "raw",
		"persistent":    true,
		"targetPVC":     claim("vm1-delta"),
	}),
	Entry("persistent, host path over host path", map[string]any{
		"backingHostPath": hostPath("/var/lib/images/fedora.raw"),
		"persistent":      true,
		"targetHostPath":  hostPath("/var/lib/overlays/default/vm1/rootdisk"),
	}),
	Entry("persistent, host path over a qcow2 claim", map[string]any{
		"backingPVC":     claim("golden-fedora-qcow2"),
		"backingFormat":  "qcow2",
		"persistent":     true,
		"targetHostPath": hostPath("/var/lib/overlays/default/vm1/rootdisk"),
	}),
	Entry("persistent, claim over a host path", map[string]any{
		"backingHostPath": hostPath("/var/lib/images/fedora.raw"),
		"persistent":      true,
		"targetPVC":       claim("vm3-delta"),
	}),
}

// An invalid overlay, the field its refusal names and what it says. Paths are
// those of a VMI; a VM's template has them under spec.template.
type refusal struct {
	volumes []volume
	field   string
	message string
}

func single(overlay map[string]any, field, message string) refusal {
	return refusal{volumes: []volume{overlayVolume("rootdisk", overlay)}, field: field, message: message}
}

var refusals = []TableEntry{
	Entry("two backings", single(map[string]any{
		"backingPVC":      claim("golden"),
		"backingHostPath": hostPath("/var/lib/images/fedora.raw"),
	}, "spec.volumes[0].overlay.backingHostPath", "must not be set together with backingPVC")),
	Entry("no backing", single(map[string]any{
		"backingFormat": "raw",
	}, "spec.volumes[0].overlay", "must have one of backingPVC or backingHostPath set")),
	Entry("two targets", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetPVC":      claim("delta"),
		"targetHostPath": hostPath("/var/lib/overlays/default/vm1/rootdisk"),
	}, "spec.volumes[0].overlay.targetHostPath", "must not be set together with targetPVC")),
	Entry("persistent without a target", single(map[string]any{
		"backingPVC": claim("golden"),
		"persistent": true,
	}, "spec.volumes[0].overlay.persistent", "requires targetPVC or targetHostPath")),
	Entry("a target claim without persistent", single(map[string]any{
		"backingPVC": claim("golden"),
		"targetPVC":  claim("delta"),
	}, "spec.volumes[0].overlay.targetPVC", "requires spec.volumes[0].overlay.persistent to be true")),
	Entry("a target host path with persistent false", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     false,
		"targetHostPath": hostPath("/var/lib/overlays/default/vm1/rootdisk"),
	}, "spec.volumes[0].overlay.targetHostPath", "requires spec.volumes[0].overlay.persistent to be true")),
	Entry("a relative backing host path", single(map[string]any{
		"backingHostPath": hostPath("images/fedora.raw"),
	}, "spec.volumes[0].overlay.backingHostPath.path", "must be an absolute path")),
	Entry("a backing host path with '..'", single(map[string]any{
		"backingHostPath": hostPath("/var/lib/images/../../etc/shadow"),
	}, "spec.volumes[0].overlay.backingHostPath.path", "must be a clean path")),
	Entry("a target host path with a trailing '/'", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/var/lib/overlays/vm1/"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must be a clean path")),
	Entry("a target host path at the root", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must not be the root directory")),
	Entry("a backing inside the kubelet's directory", single(map[string]any{
		"backingHostPath": hostPath("/var/lib/kubelet/pods/uid/volumes/disk.img"),
	}, "spec.volumes[0].overlay.backingHostPath.path", "must not be inside the kubelet's directory /var/lib/kubelet")),
	Entry("a target inside KubeVirt's private directory", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/var/run/kubevirt-private/vm1"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must not be inside KubeVirt's own directories on the node")),
	Entry("a backing inside /var/lib/kubevirt*", single(map[string]any{
		"backingHostPath": hostPath("/var/lib/kubevirt-node-labeller/disk.img"),
	}, "spec.volumes[0].overlay.backingHostPath.path", "must not be inside KubeVirt's own directories on the node")),
	Entry("a target claim that is the backing claim", single(map[string]any{
		"backingPVC": claim("golden"),
		"persistent": true,
		"targetPVC":  claim("golden"),
	}, "spec.volumes[0].overlay.targetPVC.claimName", "must not be the claim of the backing")),
	Entry("a sensitive host file outside every allowed prefix", single(map[string]any{
		"backingHostPath": hostPath("/etc/shadow"),
	}, "spec.volumes[0].overlay.backingHostPath.path", "is not below a directory the cluster allows for golden images")),
	Entry("a system directory as target outside every allowed prefix", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/etc/systemd/system"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must be <prefix>/<namespace>/<VM name>/<volume name>")),
	Entry("a target directory among the golden images", single(map[string]any{
		"backingHostPath": hostPath("/var/lib/images/fedora.raw"),
		"persistent":      true,
		"targetHostPath":  hostPath("/var/lib/images"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must be <prefix>/<namespace>/<VM name>/<volume name>")),
	Entry("the target prefix itself, shared by every VM", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/var/lib/overlays"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "must be <prefix>/<namespace>/<VM name>/<volume name>")),
	Entry("another VM's target directory", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/var/lib/overlays/default/vm2/rootdisk"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "the directory of this VM's volume: a target directory belongs to one VM")),
	Entry("the target directory of a VM in another namespace", single(map[string]any{
		"backingPVC":     claim("golden"),
		"persistent":     true,
		"targetHostPath": hostPath("/var/lib/overlays/tenant-b/vm1/rootdisk"),
	}, "spec.volumes[0].overlay.targetHostPath.path", "the directory of this VM's volume: a target directory belongs to one VM")),
	Entry("a backing in another VM's target directory", single(map[string]any{
		"backingHostPath": hostPath("/var/lib/overlays/tenant-b/vm2/rootdisk/disk.qcow2"),
		"backingFormat":   "qcow2",
	}, "spec.volumes[0].overlay.backingHostPath.path", "must not overlap the directory for overlays '/var/lib/overlays'")),
	Entry("a read-only target claim", single(map[string]any{
		"backingPVC": claim("golden"),
		"persistent": true,
		"targetPVC":  map[string]any{"claimName": "delta", "readOnly": true},
	}, "spec.volumes[0].overlay.targetPVC.readOnly", "must not be true")),
	Entry("a name too long for the pod volumes", refusal{
		volumes: []volume{overlayVolume(strings.Repeat("a", 48), map[string]any{"backingPVC": claim("golden")})},
		field:   "spec.volumes[0].name", message: "of an overlay volume must be no more than 47 characters",
	}),
	Entry("a target claim another volume uses", refusal{
		volumes: []volume{
			overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden"), "persistent": true, "targetPVC": claim("data")}),
			{"name": "datadisk", "persistentVolumeClaim": claim("data")},
		},
		field: "spec.volumes[0].overlay.targetPVC.claimName", message: "is also used by spec.volumes[1]",
	}),
	Entry("a backing claim another volume attaches writable", refusal{
		volumes: []volume{
			overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden")}),
			{"name": "datadisk", "persistentVolumeClaim": claim("golden")},
		},
		field: "spec.volumes[0].overlay.backingPVC.claimName", message: "is also attached writable by spec.volumes[1]",
	}),
	Entry("a volume taking an overlay's pod volume name", refusal{
		volumes: []volume{
			overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden")}),
			{"name": "overlay-backing-rootdisk", "emptyDisk": map[string]any{"capacity": "1Gi"}},
		},
		field: "spec.volumes[1].name", message: "'overlay-backing-rootdisk' is reserved for the overlay volume spec.volumes[0]",
	}),
	Entry("an overlay with a second volume source", refusal{
		volumes: []volume{{"name": "rootdisk", "overlay": map[string]any{"backingPVC": claim("golden")}, "emptyDisk": map[string]any{"capacity": "1Gi"}}},
		field:   "spec.volumes[0]", message: "must have exactly one source type set",
	}),
}

// templated moves the VMI field paths in text into a VM's template.
func templated(text string) string {
	return strings.ReplaceAll(text, "spec.volumes[", "spec.template.spec.volumes[")
}

var _ = Describe("overlay volume admission with the OverlayVolumes gate enabled", func() {
	Context("a VirtualMachineInstance", func() {
		DescribeTable("is admitted and keeps its overlay", func(overlay map[string]any) {
			created, err := create(vmiResource, named(newVMI(overlayVolume("rootdisk", overlay))))
			Expect(err).ToNot(HaveOccurred())

			got, err := client.Resource(vmiResource).Namespace(testNamespace).Get(context.Background(), created.GetName(), metav1.GetOptions{})
			Expect(err).ToNot(HaveOccurred())
			volumes, found, err := unstructured.NestedSlice(got.Object, "spec", "volumes")
			Expect(err).ToNot(HaveOccurred())
			Expect(found).To(BeTrue(), describe(got))
			Expect(volumes).To(ConsistOf(map[string]any{"name": "rootdisk", "overlay": overlay}), describe(got))
		}, validOverlays)

		DescribeTable("is refused naming the field", func(r refusal) {
			_, err := create(vmiResource, newVMI(r.volumes...))
			Expect(err).To(refusedBy(vmiWebhookName, r.field, r.message))
		}, refusals)

		// The CRD's schema knows the formats: the API server refuses
		// another before any webhook sees it.
		It("is refused by the schema for an unknown backingFormat", func() {
			_, err := create(vmiResource, newVMI(overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden"), "backingFormat": "vmdk"})))
			Expect(err).To(MatchError(ContainSubstring(`spec.volumes[0].overlay.backingFormat: Unsupported value: "vmdk": supported values: "raw", "qcow2"`)))
		})

		// virt-launcher cannot pass an overlay through as a SCSI LUN;
		// KubeVirt's rule that a LUN maps only to a claim refuses it first.
		It("is refused as a lun", func() {
			vmi := newVMI(overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden")}))
			Expect(unstructured.SetNestedSlice(vmi.Object, []any{map[string]any{"name": "rootdisk", "lun": map[string]any{}}},
				"spec", "domain", "devices", "disks")).To(Succeed())
			_, err := create(vmiResource, vmi)
			Expect(err).To(refusedBy(vmiWebhookName, "spec.domain.devices.disks[0].lun", "can only be mapped to a DataVolume or PersistentVolumeClaim volume"))
		})
	})

	Context("a VirtualMachine", func() {
		DescribeTable("is admitted and keeps its template's overlay", func(overlay map[string]any) {
			created, err := create(vmResource, named(newVM(overlayVolume("rootdisk", overlay))))
			Expect(err).ToNot(HaveOccurred())

			got, err := client.Resource(vmResource).Namespace(testNamespace).Get(context.Background(), created.GetName(), metav1.GetOptions{})
			Expect(err).ToNot(HaveOccurred())
			volumes, _, err := unstructured.NestedSlice(got.Object, "spec", "template", "spec", "volumes")
			Expect(err).ToNot(HaveOccurred())
			Expect(volumes).To(ConsistOf(map[string]any{"name": "rootdisk", "overlay": overlay}), describe(got))
		}, validOverlays)

		DescribeTable("is refused naming the template's field", func(r refusal) {
			_, err := create(vmResource, newVM(r.volumes...))
			Expect(err).To(refusedBy(vmWebhookName, templated(r.field), templated(r.message)))
		}, refusals)

		It("is refused when an update adds an invalid overlay", func(ctx SpecContext) {
			created, err := create(vmResource, newVM(overlayVolume("rootdisk", map[string]any{"backingPVC": claim("golden")})))
			Expect(err).ToNot(HaveOccurred())

			Expect(unstructured.SetNestedSlice(created.Object, []any{map[string]any{
				"name":    "rootdisk",
				"overlay": map[string]any{"backingPVC": claim("golden"), "persistent": true},
			}}, "spec", "template", "spec", "volumes")).To(Succeed())
			_, err = client.Resource(vmResource).Namespace(testNamespace).Update(ctx, created, metav1.UpdateOptions{})
			Expect(err).To(refusedBy(vmWebhookName, "spec.template.spec.volumes[0].overlay.persistent", "requires targetPVC or targetHostPath"))
		})
	})
})

var _ = Describe("overlay volume admission with the OverlayVolumes gate disabled", Ordered, func() {
	valid := map[string]any{
		"backingPVC": claim("golden-fedora"),
		"persistent": true,
		"targetPVC":  claim("vm1-delta"),
	}

	BeforeAll(func() {
		setFeatureGates()
		// The webhook follows the KubeVirt CR through an informer.
		Eventually(func() error {
			return dryRun(vmiResource, newVMI(overlayVolume("rootdisk", valid)))
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).ShouldNot(Succeed())
		DeferCleanup(func() {
			setFeatureGates(overlayGate)
			Eventually(func() error {
				return dryRun(vmiResource, newVMI(overlayVolume("rootdisk", valid)))
			}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		})
	})

	It("refuses a valid overlay in a VirtualMachineInstance, naming the gate", func() {
		_, err := create(vmiResource, newVMI(overlayVolume("rootdisk", valid)))
		Expect(err).To(refusedBy(vmiWebhookName, "spec.volumes[0].overlay", "the OverlayVolumes feature gate is not enabled"))
	})

	It("refuses a valid overlay in a VirtualMachine's template, naming the gate", func() {
		_, err := create(vmResource, newVM(overlayVolume("rootdisk", valid)))
		Expect(err).To(refusedBy(vmWebhookName, "spec.template.spec.volumes[0].overlay", "the OverlayVolumes feature gate is not enabled"))
	})

	It("still admits a VirtualMachineInstance without overlays", func() {
		_, err := create(vmiResource, newVMI(volume{"name": "rootdisk", "persistentVolumeClaim": claim("golden-fedora")}))
		Expect(err).ToNot(HaveOccurred())
	})
})

var _ = Describe("overlay host paths are the cluster administrator's decision", Ordered, func() {
	underPrefix := map[string]any{"backingHostPath": hostPath("/var/lib/images/fedora.raw")}
	overClaim := map[string]any{"backingPVC": claim("golden-fedora")}

	// until waits for the webhook's informer to follow the KubeVirt CR.
	until := func(admitted bool) {
		Eventually(func() error {
			return dryRun(vmiResource, newVMI(overlayVolume("rootdisk", underPrefix)))
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(WithTransform(func(err error) bool { return err == nil }, Equal(admitted)))
	}

	AfterAll(func() {
		setFeatureGates(overlayGate)
		setHostPathPrefixes(backingPrefixes, targetPrefixes)
		until(true)
	})

	It("refuses every host path while no prefix is allowed, the default, naming the KubeVirt CR's fields, and still admits claims", func() {
		setHostPathPrefixes(nil, nil)
		until(false)
		_, err := create(vmiResource, newVMI(overlayVolume("rootdisk", underPrefix)))
		Expect(err).To(refusedBy(vmiWebhookName, "spec.volumes[0].overlay.backingHostPath.path", "spec.configuration.overlayVolumes.backingHostPathPrefixes"))
		_, err = create(vmResource, newVM(overlayVolume("rootdisk", underPrefix)))
		Expect(err).To(refusedBy(vmWebhookName, "spec.template.spec.volumes[0].overlay.backingHostPath.path", "spec.configuration.overlayVolumes.backingHostPathPrefixes"))
		_, err = create(vmiResource, named(newVMI(overlayVolume("rootdisk", map[string]any{
			"backingPVC": claim("golden"), "persistent": true, "targetHostPath": hostPath("/var/lib/overlays/default/vm1/rootdisk"),
		}))))
		Expect(err).To(refusedBy(vmiWebhookName, "spec.volumes[0].overlay.targetHostPath.path", "spec.configuration.overlayVolumes.targetHostPathPrefixes"))
		_, err = create(vmiResource, newVMI(overlayVolume("rootdisk", overClaim)))
		Expect(err).ToNot(HaveOccurred())
	})

	It("admits a host path once the administrator allows its directory, and only there, without the HostDisk gate", func() {
		setHostPathPrefixes([]string{"/var/lib/images"}, nil)
		until(true)
		_, err := create(vmiResource, newVMI(overlayVolume("rootdisk", underPrefix)))
		Expect(err).ToNot(HaveOccurred())
		_, err = create(vmiResource, newVMI(overlayVolume("rootdisk", map[string]any{"backingHostPath": hostPath("/var/lib/images-old/fedora.raw")})))
		Expect(err).To(refusedBy(vmiWebhookName, "spec.volumes[0].overlay.backingHostPath.path", "is not below a directory the cluster allows for golden images"))
	})
})
