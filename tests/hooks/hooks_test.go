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
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	k8sv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	v1 "kubevirt.io/api/core/v1"
	"libvirt.org/go/libvirtxml"

	"kubevirt.io/kubevirt/pkg/hooks"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hooks/overlay/sidecar"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

const mib = 1 << 20

// guest is what the test guest writes through the overlay: 1 MiB.
var guest = testenv.GuestParams{StartLBA: 1, Sectors: 2048, Seed: 7}

var _ = Describe("the overlay hook driven by KubeVirt's hook manager", Ordered, func() {
	var lv *testenv.Libvirtd

	BeforeAll(func(ctx SpecContext) {
		lv = framework.StartSuiteLibvirtd(ctx)
	}, NodeTimeout(2*time.Minute))

	var (
		p         *pod
		name      string
		goldenSum string
		domains   int
	)

	BeforeEach(func(ctx SpecContext) {
		p = newPod()
		Expect(testenv.CreateBootDisk(ctx, p.golden, 64*mib, guest)).To(Succeed())
		var err error
		goldenSum, err = testenv.SHA256(p.golden)
		Expect(err).ToNot(HaveOccurred())
		domains++
		name = fmt.Sprintf("hook-guest-%d", domains)
	})

	// vmi is the VMI virt-launcher would pass: the golden image is disk.img
	// of a claim that is also the sidecar's PVC.
	vmi := func(config string) []byte {
		GinkgoHelper()
		sidecars, err := json.Marshal(hooks.HookSidecarList{{
			Image: "kubevirt-qcow2/overlay-hook:dev",
			PVC:   &hooks.PVC{Name: "golden-store", VolumePath: p.store, SharedComputePath: p.store},
		}})
		Expect(err).ToNot(HaveOccurred())
		v := &v1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "tests", Annotations: map[string]string{
				hooks.HookSidecarListAnnotationName: string(sidecars),
				sidecar.AnnotationKey:               config,
			}},
		}
		v.Spec.Domain.Devices.Disks = []v1.Disk{{Name: "rootdisk", DiskDevice: v1.DiskDevice{Disk: &v1.DiskTarget{Bus: v1.DiskBusVirtio}}}}
		v.Spec.Volumes = []v1.Volume{{Name: "rootdisk", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{
			PersistentVolumeClaimVolumeSource: k8sv1.PersistentVolumeClaimVolumeSource{ClaimName: "golden-store"},
		}}}}
		data, err := json.Marshal(v)
		Expect(err).ToNot(HaveOccurred())
		return data
	}

	// domain is the domain virt-launcher would define without the hook.
	domain := func() []byte {
		GinkgoHelper()
		disk := testenv.FileDisk(p.golden, "raw", "vda")
		disk.Alias = &libvirtxml.DomainAlias{Name: "ua-rootdisk"}
		dom := lv.NewDomain(name, disk)
		dom.VCPU.Placement = "static"
		data, err := xml.MarshalIndent(dom, "", "  ")
		Expect(err).ToNot(HaveOccurred())
		return data
	}

	rootDisk := func(doc []byte) libvirtxml.DomainDisk {
		GinkgoHelper()
		dom := &libvirtxml.Domain{}
		Expect(dom.Unmarshal(string(doc))).To(Succeed())
		Expect(dom.Devices.Disks).To(HaveLen(1))
		return dom.Devices.Disks[0]
	}

	// boot defines exactly the XML the hook returned, starts it and waits
	// for the guest to finish writing.
	boot := func(ctx context.Context, doc []byte) {
		GinkgoHelper()
		file := filepath.Join(p.dir, name+".xml")
		Expect(os.WriteFile(file, doc, 0o644)).To(Succeed())
		_, err := lv.Virsh(ctx, "define", file)
		Expect(err).ToNot(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) { Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed()) })
		_, err = lv.Virsh(ctx, "start", name)
		Expect(err).ToNot(HaveOccurred())
		status, err := lv.WaitForGuest(ctx, name)
		Expect(err).ToNot(HaveOccurred())
		Expect(status.Done).To(BeTrue(), "guest status %+v", status)
		Expect(status.Failed).To(BeFalse(), "guest status %+v", status)
	}

	expectGoldenUntouched := func(ctx context.Context) {
		GinkgoHelper()
		sum, err := testenv.SHA256(p.golden)
		Expect(err).ToNot(HaveOccurred())
		Expect(sum).To(Equal(goldenSum))
		Expect(testenv.VerifyGuestWrites(ctx, p.golden, "raw", guest)).ToNot(Succeed(), "the guest's writes are not in the golden image")
	}

	Context("with a persistent overlay", func() {
		const config = `{"disks":[{"name":"rootdisk","persistent":true}]}`

		It("boots through the overlay, keeps the golden image and reuses the overlay at the next start", func(ctx SpecContext) {
			p.startSidecar(ctx)
			out, err := p.define(ctx, vmi(config), domain())
			Expect(err).ToNot(HaveOccurred())
			overlay := filepath.Join(p.store, "tests", name, "rootdisk.qcow2")
			disk := rootDisk(out)
			Expect(disk.Driver.Type).To(Equal("qcow2"))
			Expect(disk.Source.File.File).To(Equal(overlay))
			Expect(disk.BackingStore.Source.File.File).To(Equal(p.golden))
			Expect(disk.BackingStore.Format.Type).To(Equal("raw"))
			created, err := os.Stat(overlay)
			Expect(err).ToNot(HaveOccurred())

			By("getting its own answer back, as on virt-launcher's second call")
			again, err := p.define(ctx, vmi(config), out)
			Expect(err).ToNot(HaveOccurred())
			Expect(rootDisk(again)).To(Equal(disk))

			boot(ctx, out)
			Expect(testenv.VerifyGuestWrites(ctx, overlay, "qcow2", guest)).To(Succeed())
			expectGoldenUntouched(ctx)
			Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed())

			By("starting again: the overlay is validated and reused, with the guest's data")
			out2, err := p.define(ctx, vmi(config), domain())
			Expect(err).ToNot(HaveOccurred())
			Expect(rootDisk(out2)).To(Equal(disk))
			reused, err := os.Stat(overlay)
			Expect(err).ToNot(HaveOccurred())
			Expect(os.SameFile(created, reused)).To(BeTrue())
			Expect(testenv.VerifyGuestWrites(ctx, overlay, "qcow2", guest)).To(Succeed())
			boot(ctx, out2)
			Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed())
			check, err := qcow2.Tool{}.Check(ctx, overlay, qcow2.InfoOptions{Format: qcow2.FormatQcow2})
			Expect(err).ToNot(HaveOccurred())
			Expect(check.Clean()).To(BeTrue(), "qemu-img check: %+v", check)
			expectGoldenUntouched(ctx)
		})

		It("accepts libvirt's own rendering of the domain it defined", func(ctx SpecContext) {
			p.startSidecar(ctx)
			out, err := p.define(ctx, vmi(config), domain())
			Expect(err).ToNot(HaveOccurred())
			file := filepath.Join(p.dir, "defined.xml")
			Expect(os.WriteFile(file, out, 0o644)).To(Succeed())
			_, err = lv.Virsh(ctx, "define", file)
			Expect(err).ToNot(HaveOccurred())
			DeferCleanup(func(ctx SpecContext) { Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed()) })
			inactive, err := lv.Virsh(ctx, "dumpxml", "--inactive", name)
			Expect(err).ToNot(HaveOccurred())

			again, err := p.define(ctx, vmi(config), []byte(inactive))
			Expect(err).ToNot(HaveOccurred())
			Expect(rootDisk(again).Source).To(Equal(rootDisk(out).Source))
			Expect(rootDisk(again).BackingStore.Source).To(Equal(rootDisk(out).BackingStore.Source))
		})

		It("refuses to start over a golden image that changed", func(ctx SpecContext) {
			p.startSidecar(ctx)
			_, err := p.define(ctx, vmi(config), domain())
			Expect(err).ToNot(HaveOccurred())

			f, err := os.OpenFile(p.golden, os.O_RDWR, 0)
			Expect(err).ToNot(HaveOccurred())
			_, err = f.WriteAt([]byte("a new release of the golden image"), 4096)
			Expect(err).ToNot(HaveOccurred())
			Expect(f.Close()).To(Succeed())

			_, err = p.define(ctx, vmi(config), domain())
			Expect(err).To(MatchError(ContainSubstring("backing image changed since the overlay was created")))
			Expect(err).To(MatchError(ContainSubstring(p.golden)))
		})
	})

	Context("with an ephemeral overlay", func() {
		const config = `{"disks":[{"name":"rootdisk"}]}`

		It("keeps it beside the socket and removes it when virt-launcher shuts the hooks down", func(ctx SpecContext) {
			exited := p.startSidecar(ctx)
			out, err := p.define(ctx, vmi(config), domain())
			Expect(err).ToNot(HaveOccurred())
			overlay := filepath.Join(p.socketDir, "overlays", "rootdisk.qcow2")
			Expect(rootDisk(out).Source.File.File).To(Equal(overlay))

			boot(ctx, out)
			Expect(testenv.VerifyGuestWrites(ctx, overlay, "qcow2", guest)).To(Succeed())
			expectGoldenUntouched(ctx)
			Expect(lv.DestroyAndUndefine(ctx, name)).To(Succeed())

			_, err = p.client(ctx, "shutdown")
			Expect(err).ToNot(HaveOccurred())
			Expect(overlay).ToNot(BeAnExistingFile())
			Eventually(exited).WithContext(ctx).Should(BeClosed(), "the sidecar exits after Shutdown")
			expectGoldenUntouched(ctx)
		})
	})

	DescribeTable("fails loudly, with the reason in the error virt-launcher reports",
		func(ctx SpecContext, config, message string) {
			p.startSidecar(ctx)
			out, err := p.define(ctx, vmi(config), domain())
			Expect(err).To(MatchError(ContainSubstring(message)))
			Expect(out).To(BeNil())
		},
		Entry("a malformed annotation", `{"disks":[{"name":"rootdisk"`, "unexpected EOF"),
		Entry("a misspelt field", `{"disks":[{"name":"rootdisk","persistant":true}]}`, `unknown field "persistant"`), //nolint:misspell // the misspelling is the input under test
		Entry("an unknown volume", `{"disks":[{"name":"data"}]}`, `VMI has no disk "data"`),
	)

	It("passes cloud-init data through when subscribed to PreCloudInitIso", func(ctx SpecContext) {
		p.startSidecar(ctx, "--hook-points", "OnDefineDomain,PreCloudInitIso,Shutdown")
		vmiFile := filepath.Join(p.dir, "vmi.json")
		Expect(os.WriteFile(vmiFile, vmi(`{"disks":[]}`), 0o644)).To(Succeed())
		out, err := p.client(ctx, "cloudinit", "--vmi", vmiFile, "--user-data", "#cloud-config\npassword: fedora\n")
		Expect(err).ToNot(HaveOccurred())
		var data struct {
			UserData string `json:"UserData"`
		}
		Expect(json.Unmarshal([]byte(out), &data)).To(Succeed())
		Expect(data.UserData).To(Equal("#cloud-config\npassword: fedora\n"))
	})

	It("gives the same domain through KubeVirt's sidecar-shim", func(ctx SpecContext) {
		const config = `{"disks":[{"name":"rootdisk","persistent":true}]}`
		// The shim looks for onDefineDomain in $PATH and only knows
		// /var/run/kubevirt-hooks: give it both in its own namespace.
		binDir := filepath.Join(p.dir, "bin")
		Expect(os.MkdirAll(binDir, 0o755)).To(Succeed())
		Expect(os.Symlink(bins.hook, filepath.Join(binDir, sidecar.ShimOnDefineDomain))).To(Succeed())
		shimRun := filepath.Join(p.dir, "shim-run")
		Expect(os.MkdirAll(shimRun, 0o755)).To(Succeed())
		Expect(os.Symlink(p.socketDir, filepath.Join(shimRun, "kubevirt-hooks"))).To(Succeed())
		shim := exec.Command("unshare", "--mount", "--propagation", "private",
			bins.client, "exec", "--run-dir", shimRun, "--", bins.shim, "--version", "v1alpha3")
		shim.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"), "CONTAINER_NAME=hook-sidecar-0",
			"OVERLAY_HOOK_SOCKET_DIR="+p.socketDir, "OVERLAY_HOOK_COMPUTE_SOCKET_DIR="+p.socketDir)
		shim.Stdout, shim.Stderr = GinkgoWriter, GinkgoWriter
		Expect(shim.Start()).To(Succeed())
		DeferCleanup(func() { _ = shim.Process.Kill(); _ = shim.Wait() })
		Eventually(func() ([]string, error) { return filepath.Glob(filepath.Join(p.socketDir, "shim-*.sock")) }).
			WithContext(ctx).Should(HaveLen(1))

		out, err := p.define(ctx, vmi(config), domain())
		Expect(err).ToNot(HaveOccurred())
		disk := rootDisk(out)
		Expect(disk.Source.File.File).To(Equal(filepath.Join(p.store, "tests", name, "rootdisk.qcow2")))
		Expect(disk.BackingStore.Source.File.File).To(Equal(p.golden))
		boot(ctx, out)
		Expect(testenv.VerifyGuestWrites(ctx, disk.Source.File.File, "qcow2", guest)).To(Succeed())
		expectGoldenUntouched(ctx)

		By("failing the call when the hook fails")
		_, err = p.define(ctx, vmi(`{"disks":[{"name":"data"}]}`), domain())
		Expect(err).To(MatchError(ContainSubstring("exit status 1")))
	})
})
