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

package sidecar

import (
	"encoding/json"
	"encoding/xml"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	k8sv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/os/disk"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter"
	archconverter "kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/converter/arch"
)

func TestSidecar(t *testing.T) {
	RegisterFailHandler(Fail)
	// Gomega's one-second default is a wall-clock bound a loaded machine
	// can miss; a condition that holds returns at once.
	SetDefaultEventuallyTimeout(time.Minute)
	RunSpecs(t, "overlay sidecar Suite")
}

// Domains in these tests come from KubeVirt v1.7.0's own converter,
// serialised the way its hook manager sends them to a sidecar.

// fakeEphemeralDisks names container disk overlays as virt-launcher does,
// without creating them.
type fakeEphemeralDisks struct{}

func (fakeEphemeralDisks) CreateBackedImageForVolume(v1.Volume, string, string) error { return nil }
func (fakeEphemeralDisks) CreateEphemeralImages(*v1.VirtualMachineInstance, *api.Domain) error {
	return nil
}
func (fakeEphemeralDisks) GetFilePath(volume string) string {
	return filepath.Join("/var/run/kubevirt-ephemeral-disks/disk-data", volume, "disk.qcow2")
}
func (fakeEphemeralDisks) Init() error { return nil }

// fixture is a VMI and what the converter needs to know about its volumes.
type fixture struct {
	vmi       *v1.VirtualMachineInstance
	blockPVCs map[string]bool
}

// domainSpec converts the fixture's VMI with KubeVirt's converter.
func (f fixture) domainSpec() *api.DomainSpec {
	GinkgoHelper()
	v1.SetObjectDefaults_VirtualMachineInstance(f.vmi)
	c := &converter.ConverterContext{
		VirtualMachine:       f.vmi,
		Architecture:         archconverter.NewConverter(runtime.GOARCH),
		AllowEmulation:       true,
		EphemeraldiskCreator: fakeEphemeralDisks{},
		IsBlockPVC:           f.blockPVCs,
		IsBlockDV:            map[string]bool{},
		ExpandDisksEnabled:   true,
		DisksInfo:            map[string]*disk.DiskInfo{"containerdisk": {Format: "qcow2", VirtualSize: 5 << 30}},
	}
	domain := &api.Domain{}
	Expect(converter.Convert_v1_VirtualMachineInstance_To_api_Domain(f.vmi, domain, c)).To(Succeed())
	api.NewDefaulter(runtime.GOARCH).SetObjectDefaults_Domain(domain)
	return &domain.Spec
}

// domainXML is the domain as virt-launcher's hook manager sends it.
func (f fixture) domainXML() []byte {
	GinkgoHelper()
	data, err := xml.MarshalIndent(f.domainSpec(), "", "\t")
	Expect(err).ToNot(HaveOccurred())
	return data
}

func (f fixture) vmiJSON() []byte {
	GinkgoHelper()
	data, err := json.Marshal(f.vmi)
	Expect(err).ToNot(HaveOccurred())
	return data
}

func newDisk(name string, bus v1.DiskBus) v1.Disk {
	return v1.Disk{Name: name, DiskDevice: v1.DiskDevice{Disk: &v1.DiskTarget{Bus: bus}}}
}

func pvcVolume(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
		PersistentVolumeClaimVolumeSource: k8sv1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}}}
}

func pvcStatus(name string, capacity string) v1.VolumeStatus {
	overhead := v1.Percent("0.055")
	return v1.VolumeStatus{Name: name, PersistentVolumeClaimInfo: &v1.PersistentVolumeClaimInfo{
		ClaimName:          name,
		Capacity:           k8sv1.ResourceList{k8sv1.ResourceStorage: resource.MustParse(capacity)},
		Requests:           k8sv1.ResourceList{k8sv1.ResourceStorage: resource.MustParse(capacity)},
		FilesystemOverhead: &overhead,
	}}
}

// richVMI has a disk of most kinds KubeVirt renders, so that a round trip
// meets every element KubeVirt puts into <disk>.
func richVMI(name string, rootVolume v1.Volume) *v1.VirtualMachineInstance {
	boot := uint(1)
	vmi := &v1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "8d2d2a9e-0a4b-4d0e-9b2e-3f5c1e2d4a6b"},
	}
	root := newDisk("rootdisk", v1.DiskBusVirtio)
	root.BootOrder = &boot
	root.Cache = v1.CacheNone
	root.IO = v1.IONative
	root.Serial = "root-serial"
	root.BlockSize = &v1.BlockSize{Custom: &v1.CustomBlockSize{Logical: 512, Physical: 4096}}
	data := newDisk("datadisk", v1.DiskBusSCSI)
	data.ErrorPolicy = pointerTo(v1.DiskErrorPolicyReport)
	sata := newDisk("satadisk", v1.DiskBusSATA)
	vmi.Spec.Domain.Devices.Disks = []v1.Disk{
		root, data, sata,
		newDisk("scratch", v1.DiskBusVirtio),
		newDisk("containerdisk", v1.DiskBusVirtio),
		{Name: "cloudinit", DiskDevice: v1.DiskDevice{CDRom: &v1.CDRomTarget{Bus: v1.DiskBusSATA}}},
	}
	vmi.Spec.Volumes = []v1.Volume{
		rootVolume,
		pvcVolume("datadisk", "data-claim"),
		{Name: "satadisk", VolumeSource: v1.VolumeSource{HostDisk: &v1.HostDisk{Path: "/var/lib/images/sata.img", Type: v1.HostDiskExists}}},
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDisk: &v1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
		{Name: "containerdisk", VolumeSource: v1.VolumeSource{ContainerDisk: &v1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora"}}},
		{Name: "cloudinit", VolumeSource: v1.VolumeSource{CloudInitNoCloud: &v1.CloudInitNoCloudSource{UserData: "#cloud-config\n"}}},
	}
	vmi.Status.VolumeStatus = []v1.VolumeStatus{pvcStatus("rootdisk", "10Gi"), pvcStatus("datadisk", "2Gi")}
	return vmi
}

func pointerTo[T any](v T) *T { return &v }

// The fixtures of the round-trip tests, by the kind of the root volume.
func fixtures() map[string]fixture {
	return map[string]fixture{
		"filesystem PVC": {vmi: richVMI("fs-pvc", pvcVolume("rootdisk", "golden"))},
		"block PVC": {
			vmi:       richVMI("block-pvc", pvcVolume("rootdisk", "golden-block")),
			blockPVCs: map[string]bool{"rootdisk": true, "datadisk": true},
		},
		"DataVolume": {vmi: richVMI("dv", v1.Volume{Name: "rootdisk", VolumeSource: v1.VolumeSource{DataVolume: &v1.DataVolumeSource{Name: "golden-dv"}}})},
		"host disk": {vmi: richVMI("hostdisk", v1.Volume{Name: "rootdisk", VolumeSource: v1.VolumeSource{HostDisk: &v1.HostDisk{
			Path: "/var/lib/images/golden.raw", Type: v1.HostDiskExists,
		}}})},
	}
}

// withHookAnnotations adds the sidecar list (with a PVC) and the overlay
// configuration to a VMI.
func withHookAnnotations(vmi *v1.VirtualMachineInstance, pvc *hooks.PVC, cfg string) *v1.VirtualMachineInstance {
	GinkgoHelper()
	list := hooks.HookSidecarList{{Image: "registry.example/overlay-hook:v1", Args: []string{"--version", "v1alpha3"}, PVC: pvc}}
	data, err := json.Marshal(list)
	Expect(err).ToNot(HaveOccurred())
	if vmi.Annotations == nil {
		vmi.Annotations = map[string]string{}
	}
	vmi.Annotations[hooks.HookSidecarListAnnotationName] = string(data)
	vmi.Annotations[AnnotationKey] = cfg
	return vmi
}

var _ = Describe("KubeVirt's layout", func() {
	It("matches the constants the hook relies on", func() {
		Expect(converter.GetFilesystemVolumePath("rootdisk")).To(Equal(filepath.Join(vmiDisksDir, "rootdisk", "disk.img")))
		Expect(hookSidecarsAnnotation).To(Equal(hooks.HookSidecarListAnnotationName))
		Expect(api.UserAliasPrefix).To(Equal(userAliasPrefix))
	})
})
