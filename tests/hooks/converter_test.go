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

package hooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"libvirt.org/go/libvirtxml"
	"sigs.k8s.io/yaml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// The hook and the overlay patch series must give QEMU the same disk: the
// hook edits what an unpatched converter makes of a claim, the series
// converts an overlay volume itself. vmi2domain (internal/testenv) runs the
// patched tree's converter; for a plain claim that code is upstream's.
var _ = Describe("the hook's disk compared with the patched converter's", Ordered, func() {
	const (
		claimDir   = "/var/run/kubevirt-private/vmi-disks/rootdisk"
		backingDir = "/var/run/kubevirt-private/overlay-backing/rootdisk"
		ephemeral  = "/var/run/kubevirt-ephemeral-disks"
	)
	var vmi2domain testenv.VMI2Domain

	BeforeAll(func(ctx SpecContext) {
		_, err := os.Stat(filepath.Join(testenv.KubeVirtTree(), "pkg", "storage", "overlay", "overlay.go"))
		framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")
		vmi2domain, err = testenv.BuildVMI2Domain(ctx, GinkgoT().TempDir())
		Expect(err).ToNot(HaveOccurred())
	}, NodeTimeout(15*time.Minute))

	convert := func(ctx context.Context, vmi map[string]any, args ...string) []byte {
		GinkgoHelper()
		data, err := yaml.Marshal(vmi)
		Expect(err).ToNot(HaveOccurred())
		file := filepath.Join(GinkgoT().TempDir(), "vmi.yaml")
		Expect(os.WriteFile(file, data, 0o644)).To(Succeed())
		out, _, err := testenv.Launcher{Tool: vmi2domain, VMI: file, BackingClaims: map[string]string{"rootdisk": "golden-store-uid"}}.Run(ctx, args...)
		Expect(err).ToNot(HaveOccurred())
		return []byte(out)
	}
	onlyDisk := func(doc []byte) libvirtxml.DomainDisk {
		GinkgoHelper()
		dom := &libvirtxml.Domain{}
		Expect(dom.Unmarshal(string(doc))).To(Succeed())
		Expect(dom.Devices.Disks).To(HaveLen(1))
		return dom.Devices.Disks[0]
	}
	vmi := func(name string, annotations map[string]string, volume map[string]any) map[string]any {
		return map[string]any{
			"apiVersion": "kubevirt.io/v1",
			"kind":       "VirtualMachineInstance",
			"metadata":   map[string]any{"name": name, "namespace": "tests", "annotations": annotations},
			"spec": map[string]any{
				"domain":  map[string]any{"devices": map[string]any{"disks": []any{map[string]any{"name": "rootdisk", "disk": map[string]any{"bus": "virtio"}}}}},
				"volumes": []any{volume},
			},
		}
	}

	DescribeTable("gives QEMU the same disk for an ephemeral overlay",
		func(ctx SpecContext, backingFormat string) {
			p := newPod()
			raw := filepath.Join(p.dir, "boot.raw")
			Expect(testenv.CreateBootDisk(ctx, raw, 64*mib, guest)).To(Succeed())
			_, err := testenv.QemuImg(ctx, "convert", "-f", "raw", "-O", backingFormat, raw, p.golden)
			Expect(err).ToNot(HaveOccurred())

			By("letting the hook edit the unpatched converter's claim disk")
			sidecars := fmt.Sprintf(`[{"image":"kubevirt-qcow2/overlay-hook:dev","pvc":{"name":"golden-store","volumePath":%q,"sharedComputePath":%q}}]`, p.store, p.store)
			hooked := vmi("hooked", map[string]string{
				"hooks.kubevirt.io/hookSidecars":  sidecars,
				"overlay.kubevirt-qcow2.io/disks": fmt.Sprintf(`{"disks":[{"name":"rootdisk","backingFormat":%q}]}`, backingFormat),
			}, map[string]any{"name": "rootdisk", "persistentVolumeClaim": map[string]any{"claimName": "golden-store"}})
			plain := convert(ctx, hooked, "-map", claimDir+"="+p.store)
			vmiJSON, err := json.Marshal(hooked)
			Expect(err).ToNot(HaveOccurred())
			p.startSidecar(ctx)
			edited, err := p.define(ctx, vmiJSON, plain)
			Expect(err).ToNot(HaveOccurred())
			fromHook := onlyDisk(edited)

			By("converting an overlay volume with the patched converter")
			patched := vmi("patched", nil, map[string]any{"name": "rootdisk", "overlay": map[string]any{
				"backingPVC": map[string]any{"claimName": "golden-store"}, "backingFormat": backingFormat,
			}})
			fromSeries := onlyDisk(convert(ctx, patched, "-prepare",
				"-map", backingDir+"="+p.store, "-map", ephemeral+"="+filepath.Join(p.dir, "ephemeral")))

			By("comparing what QEMU is given, except where each keeps its overlay")
			for _, disk := range []libvirtxml.DomainDisk{fromHook, fromSeries} {
				Expect(disk.Source.File).ToNot(BeNil())
				Expect(disk.Source.File.File).To(HaveSuffix(".qcow2"))
				Expect(disk.BackingStore.Source.File.File).To(Equal(p.golden))
			}
			Expect(fromHook.Source.File.File).ToNot(Equal(fromSeries.Source.File.File))
			Expect(fromHook.Driver).To(Equal(fromSeries.Driver))
			Expect(fromHook.Target).To(Equal(fromSeries.Target))
			Expect(fromHook.Alias).To(Equal(fromSeries.Alias))
			Expect(fromHook.ReadOnly).To(Equal(fromSeries.ReadOnly))
			Expect(fromHook.BackingStore.Format).To(Equal(fromSeries.BackingStore.Format))
			Expect(strings.ToLower(fromHook.BackingStore.Format.Type)).To(Equal(backingFormat))
		},
		Entry("over a raw golden image", "raw"),
		Entry("over a qcow2 golden image", "qcow2"),
	)
})
