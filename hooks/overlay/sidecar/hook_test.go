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
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	v1 "kubevirt.io/api/core/v1"

	"kubevirt.io/kubevirt/pkg/hooks"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/overlay"
)

const (
	computeStore   = "/var/run/kubevirt-qcow2/store"
	computeSockets = "/var/run/kubevirt-hooks/hook-sidecar-0"
	goldenInPod    = "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"
)

// The hook as a pod runs it: the golden image is disk.img of an RWX claim
// that is both the VMI's root volume and the sidecar's PVC; the sidecar
// sees the claim at store, the compute container at computeStore.
var _ = Describe("Hook", func() {
	var (
		ctx    context.Context
		store  string
		golden string
		hook   *Hook
		f      fixture
		pvc    *hooks.PVC
	)

	BeforeEach(func() {
		ctx = context.Background()
		tmp := GinkgoT().TempDir()
		store = filepath.Join(tmp, "store")
		Expect(os.MkdirAll(store, 0o755)).To(Succeed())
		golden = filepath.Join(store, "disk.img")
		Expect(os.WriteFile(golden, []byte("golden boot sector"), 0o644)).To(Succeed())
		Expect(os.Truncate(golden, 8<<20)).To(Succeed())
		hook = NewHook(Environment{
			ContainerName:    "hook-sidecar-0",
			SocketDir:        filepath.Join(tmp, "sockets"),
			ComputeSocketDir: computeSockets,
			PodName:          "virt-launcher-vm1-x7k2p",
		}, overlay.Native{}, logr.Discard())
		pvc = &hooks.PVC{Name: "golden-store", VolumePath: store, SharedComputePath: computeStore}
		f = fixture{vmi: richVMI("vm1", pvcVolume("rootdisk", "golden-store"))}
	})

	configure := func(cfg string) {
		withHookAnnotations(f.vmi, pvc, cfg)
	}

	rootDisk := func(doc []byte) *api.Disk {
		GinkgoHelper()
		spec := &api.DomainSpec{}
		Expect(xml.Unmarshal(doc, spec)).To(Succeed())
		for i := range spec.Devices.Disks {
			if spec.Devices.Disks[i].Alias.GetName() == "rootdisk" {
				return &spec.Devices.Disks[i]
			}
		}
		Fail("no rootdisk")
		return nil
	}

	Context("with a persistent overlay", func() {
		BeforeEach(func() {
			configure(`{"disks":[{"name":"rootdisk","persistent":true}]}`)
		})

		It("creates it in the PVC and points the disk at the compute container's view of it", func() {
			goldenSum := sha256Of(golden)
			out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())

			d := rootDisk(out)
			Expect(d.Source.File).To(Equal(computeStore + "/default/vm1/rootdisk.qcow2"))
			Expect(d.Driver.Type).To(Equal("qcow2"))
			Expect(d.BackingStore.Source.File).To(Equal(goldenInPod))
			Expect(d.BackingStore.Format.Type).To(Equal("raw"))

			local := filepath.Join(store, "default", "vm1", "rootdisk.qcow2")
			h, err := overlay.Native{}.Inspect(ctx, local)
			Expect(err).ToNot(HaveOccurred())
			Expect(h.BackingFile).To(Equal(goldenInPod), "QEMU opens the backing where the compute container sees it")
			Expect(h.VirtualSize).To(Equal(int64(8 << 20)))
			Expect(sha256Of(golden)).To(Equal(goldenSum))
		})

		It("is idempotent: the second call of a start gets its own answer back unchanged", func() {
			first, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())
			local := filepath.Join(store, "default", "vm1", "rootdisk.qcow2")
			before, err := os.Stat(local)
			Expect(err).ToNot(HaveOccurred())

			second, err := hook.OnDefineDomain(ctx, f.vmiJSON(), first)
			Expect(err).ToNot(HaveOccurred())
			Expect(second).To(Equal(first))
			after, err := os.Stat(local)
			Expect(err).ToNot(HaveOccurred())
			Expect(os.SameFile(before, after)).To(BeTrue(), "no second overlay")
		})

		It("reuses the overlay at the next start and refuses it once the golden image changed", func() {
			_, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())
			_, err = hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())

			Expect(os.WriteFile(golden, []byte("another golden image"), 0o644)).To(Succeed())
			Expect(os.Truncate(golden, 8<<20)).To(Succeed())
			out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).To(MatchError(overlay.ErrBackingChanged))
			Expect(err).To(MatchError(ContainSubstring("disk rootdisk")))
			Expect(out).To(BeNil())
		})

		It("uses the configured path, format, size and options", func() {
			configure(`{"disks":[{"name":"rootdisk","persistent":true,"path":"vms/one.qcow2","size":"16Mi"}],` +
				`"identity":"sha256","create":{"clusterSize":"128Ki","extendedL2":true}}`)
			out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())
			Expect(rootDisk(out).Source.File).To(Equal(computeStore + "/vms/one.qcow2"))
			local := filepath.Join(store, "vms", "one.qcow2")
			h, err := overlay.Native{}.Inspect(ctx, local)
			Expect(err).ToNot(HaveOccurred())
			Expect(h.VirtualSize).To(Equal(int64(16 << 20)))
			record, err := os.ReadFile(local + overlay.RecordSuffix)
			Expect(err).ToNot(HaveOccurred())
			Expect(string(record)).To(ContainSubstring(`"method": "sha256"`))
		})

		It("validates the overlay on a live-migration target without creating one", func() {
			_, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())
			f.vmi.Status.Phase = v1.Running
			f.vmi.Status.MigrationState = &v1.VirtualMachineInstanceMigrationState{TargetPod: hook.Env.PodName}
			_, err = hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())

			Expect(os.RemoveAll(filepath.Join(store, "default"))).To(Succeed())
			_, err = hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).To(MatchError(overlay.ErrInvalidOverlay))
		})
	})

	Context("with an ephemeral overlay", func() {
		BeforeEach(func() {
			configure(`{"disks":[{"name":"rootdisk"}]}`)
		})

		It("creates it beside the socket, reuses it in the same pod and removes it at Shutdown", func() {
			out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).ToNot(HaveOccurred())
			Expect(rootDisk(out).Source.File).To(Equal(computeSockets + "/overlays/rootdisk.qcow2"))
			local := filepath.Join(hook.Env.SocketDir, "overlays", "rootdisk.qcow2")
			Expect(local).To(BeAnExistingFile())

			again, err := hook.OnDefineDomain(ctx, f.vmiJSON(), out)
			Expect(err).ToNot(HaveOccurred())
			Expect(again).To(Equal(out))

			Expect(hook.Shutdown()).To(Succeed())
			Expect(local).ToNot(BeAnExistingFile())
			Expect(local + overlay.RecordSuffix).ToNot(BeAnExistingFile())
			Expect(golden).To(BeAnExistingFile())
		})

		It("refuses to follow a live migration", func() {
			f.vmi.Status.Phase = v1.Running
			_, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).To(MatchError(ContainSubstring("cannot follow a live migration")))
		})
	})

	// Kubernetes mounts a claim once per pod: the disk's volume is an
	// emptyDisk holding the place, the golden image is named on the
	// sidecar's claim.
	Context("with the backing named on the sidecar's claim", func() {
		BeforeEach(func() {
			f = fixture{vmi: richVMI("vm1", v1.Volume{Name: "rootdisk", VolumeSource: v1.VolumeSource{
				EmptyDisk: &v1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")},
			}})}
		})

		DescribeTable("makes the overlay over it, the placeholder left out",
			func(cfg, overlayInPod string, local func() string) {
				configure(cfg)
				goldenSum := sha256Of(golden)
				out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
				Expect(err).ToNot(HaveOccurred())
				d := rootDisk(out)
				Expect(d.Source.File).To(Equal(overlayInPod))
				Expect(d.Driver.Type).To(Equal("qcow2"))
				Expect(d.BackingStore.Source.File).To(Equal(computeStore + "/disk.img"))
				Expect(d.BackingStore.Format.Type).To(Equal("raw"))
				Expect(string(out)).ToNot(ContainSubstring("empty-disks/rootdisk.qcow2"), "the placeholder is still in the domain")

				h, err := overlay.Native{}.Inspect(ctx, filepath.Join(local(), "rootdisk.qcow2"))
				Expect(err).ToNot(HaveOccurred())
				Expect(h.BackingFile).To(Equal(computeStore+"/disk.img"), "QEMU opens the backing where the compute container sees the claim")
				Expect(h.VirtualSize).To(Equal(int64(8 << 20)))

				again, err := hook.OnDefineDomain(ctx, f.vmiJSON(), out)
				Expect(err).ToNot(HaveOccurred())
				Expect(again).To(Equal(out))
				Expect(sha256Of(golden)).To(Equal(goldenSum))
			},
			Entry("persistent", `{"disks":[{"name":"rootdisk","persistent":true,"backing":"disk.img"}]}`,
				computeStore+"/default/vm1/rootdisk.qcow2", func() string { return filepath.Join(store, "default", "vm1") }),
			Entry("ephemeral", `{"disks":[{"name":"rootdisk","backing":"disk.img"}]}`,
				computeSockets+"/overlays/rootdisk.qcow2", func() string { return filepath.Join(hook.Env.SocketDir, "overlays") }),
		)

		It("needs the sidecar's claim", func() {
			pvc = nil
			configure(`{"disks":[{"name":"rootdisk","backing":"disk.img"}]}`)
			_, err := hook.OnDefineDomain(ctx, f.vmiJSON(), f.domainXML())
			Expect(err).To(MatchError(ContainSubstring(`configured backings live in the sidecar's PVC, but entry 0 of hooks.kubevirt.io/hookSidecars has no "pvc"`)))
		})
	})

	It("returns the domain unchanged for an empty disk list", func() {
		configure(`{"disks":[]}`)
		doc := f.domainXML()
		out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), doc)
		Expect(err).ToNot(HaveOccurred())
		Expect(out).To(Equal(doc))
	})

	DescribeTable("fails loudly, returning no domain",
		func(prepare func(f *fixture, pvc **hooks.PVC) string, message string) {
			cfg := prepare(&f, &pvc)
			doc := f.domainXML()
			if cfg != "-" {
				configure(cfg)
			}
			if cfg == "missing disk" {
				f.vmi.Spec.Domain.Devices.Disks = append(f.vmi.Spec.Domain.Devices.Disks, newDisk("late", v1.DiskBusVirtio))
				f.vmi.Spec.Volumes = append(f.vmi.Spec.Volumes, pvcVolume("late", "golden-store"))
				configure(`{"disks":[{"name":"late"}]}`)
			}
			out, err := hook.OnDefineDomain(ctx, f.vmiJSON(), doc)
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(out).To(BeNil())
		},
		Entry("no annotation", func(*fixture, **hooks.PVC) string { return "-" }, "has no annotation "+AnnotationKey),
		Entry("a malformed annotation", func(*fixture, **hooks.PVC) string { return `{"disks":[{"name":"rootdisk",}]}` }, "invalid character"),
		Entry("an unknown disk", func(*fixture, **hooks.PVC) string { return `{"disks":[{"name":"rootdsik"}]}` }, `VMI has no disk "rootdsik"`),
		Entry("a disk missing from the domain", func(*fixture, **hooks.PVC) string { return "missing disk" }, "the domain has no disk with alias ua-late"),
		Entry("a CD-ROM", func(*fixture, **hooks.PVC) string { return `{"disks":[{"name":"cloudinit"}]}` }, "device is a cdrom"),
		Entry("a container disk", func(*fixture, **hooks.PVC) string { return `{"disks":[{"name":"containerdisk"}]}` }, "already has a backing chain"),
		Entry("a backing the sidecar cannot see", func(*fixture, **hooks.PVC) string { return `{"disks":[{"name":"datadisk"}]}` }, "is not visible to the sidecar"),
		Entry("a persistent overlay without a PVC", func(_ *fixture, p **hooks.PVC) string {
			*p = nil
			return `{"disks":[{"name":"rootdisk","persistent":true}]}`
		}, `has no "pvc"`),
		Entry("a hotpluggable volume", func(f *fixture, _ **hooks.PVC) string {
			f.vmi.Spec.Volumes[0].PersistentVolumeClaim.Hotpluggable = true
			return `{"disks":[{"name":"rootdisk"}]}`
		}, "is hotpluggable"),
		Entry("a backing format KubeVirt did not give", func(*fixture, **hooks.PVC) string {
			return `{"disks":[{"name":"rootdisk","backingFormat":"qcow2"}]}`
		}, "not a qcow2 image"),
	)

	It("fails on a VMI that is not JSON", func() {
		_, err := hook.OnDefineDomain(ctx, []byte("<vmi/>"), f.domainXML())
		Expect(err).To(MatchError(ContainSubstring("parse VMI")))
	})

	Describe("the sidecar-shim contract", func() {
		BeforeEach(func() {
			configure(`{"disks":[{"name":"rootdisk"}]}`)
		})

		It("prints the new domain", func() {
			var stdout bytes.Buffer
			args := []string{"--vmi", string(f.vmiJSON()), "--domain", string(f.domainXML())}
			Expect(RunShimOnDefineDomain(ctx, hook, args, &stdout)).To(Succeed())
			Expect(rootDisk(stdout.Bytes()).Driver.Type).To(Equal("qcow2"))
		})

		It("prints nothing and fails on a bad call", func() {
			var stdout bytes.Buffer
			Expect(RunShimOnDefineDomain(ctx, hook, []string{"--vmi", "{}"}, &stdout)).To(MatchError(ContainSubstring("--domain")))
			Expect(RunShimOnDefineDomain(ctx, hook, []string{"--vmi", "{}", "--domain", "<domain/>"}, &stdout)).To(MatchError(ContainSubstring("parse VMI")))
			Expect(stdout.Len()).To(BeZero())
		})

		It("passes cloud-init data through", func() {
			var stdout bytes.Buffer
			data := `{"dataSource":"NoCloud","userData":"#cloud-config\n"}`
			Expect(RunShimPreCloudInitIso([]string{"--vmi", "{}", "--cloud-init", data}, &stdout)).To(Succeed())
			Expect(stdout.String()).To(Equal(data))
		})
	})
})

func sha256Of(path string) [32]byte {
	GinkgoHelper()
	fh, err := os.Open(path)
	Expect(err).ToNot(HaveOccurred())
	defer fh.Close()
	h := sha256.New()
	_, err = io.Copy(h, fh)
	Expect(err).ToNot(HaveOccurred())
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
