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

package backup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// guestRounds are the writes the test guest makes before each backup: the
// first fills 8 MiB, the next two change 1 MiB and 512 KiB elsewhere.
var guestRounds = []testenv.GuestParams{
	{StartLBA: 1, Sectors: 16384, Seed: 1},
	{StartLBA: 8192, Sectors: 2048, Seed: 2},
	{StartLBA: 40000, Sectors: 1024, Seed: 3},
}

var _ = Describe("backups of a running libvirt domain", Ordered, func() {
	var (
		lv      *testenv.Libvirtd
		bin     string
		work    string
		storage []string
		repo    *backup.Repository
	)
	const domName = "backup-guest"
	vm := catalog.VM{Namespace: "prod", Name: "guest"}
	live := func() string { return filepath.Join(work, "live.qcow2") }

	BeforeAll(func(ctx SpecContext) {
		lv = framework.StartSuiteLibvirtd(ctx)
		bin = buildCLI(ctx)
		work = GinkgoT().TempDir()
		srv := startS3(ctx)
		creds, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		bsl := filepath.Join(work, "bsl.yaml")
		Expect(os.WriteFile(bsl, []byte(srv.BSL("backups", "velero")), 0o600)).To(Succeed())
		storage = []string{"-bsl", bsl, "-credentials", creds}
		repo = newRepository(ctx, srv.BSL("backups", "velero"), creds)

		raw := filepath.Join(work, "boot.raw")
		Expect(testenv.CreateBootDisk(ctx, raw, 64*mib, guestRounds[0])).To(Succeed())
		_, err = testenv.QemuImg(ctx, "convert", "-f", "raw", "-O", "qcow2", raw, live())
		Expect(err).NotTo(HaveOccurred())
		Expect(lv.DefineAndStart(ctx, lv.NewDomain(domName, testenv.FileDisk(live(), "qcow2", "vda")))).To(Succeed())
		DeferCleanup(lv.DestroyAndUndefine, domName)
	}, NodeTimeout(20*time.Minute))

	expected := func(b string) string { return filepath.Join(work, b+".expected.raw") }

	// runGuest boots the domain so the test guest writes round p, waits for
	// it to finish, backs it up with the command and returns what the
	// command reported. The domain keeps running during the backup; it is
	// stopped afterwards only to copy the live disk as the backup saw it.
	runGuest := func(ctx context.Context, round int, name string, extra ...string) (string, int64) {
		p := guestRounds[round]
		if round > 0 {
			Expect(testenv.WriteBootSector(ctx, live(), "qcow2", p)).To(Succeed())
			_, err := lv.Virsh(ctx, "start", domName)
			Expect(err).NotTo(HaveOccurred())
		}
		status, err := lv.WaitForGuest(ctx, domName)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Done).To(BeTrue(), "guest status %+v", status)

		args := append([]string{"backup", "-uri", lv.URI(), "-domain", domName, "-namespace", vm.Namespace, "-vm", vm.Name,
			"-backup", name, "-work-dir", work, "-o", "json"}, storage...)
		out, stderr, err := cli(ctx, bin, append(args, extra...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		var res struct {
			Checkpoint    string `json:"checkpoint"`
			Type          string `json:"type"`
			BytesUploaded int64  `json:"bytesUploaded"`
		}
		Expect(json.Unmarshal([]byte(out), &res)).To(Succeed(), out)
		Expect(res.Checkpoint).To(HavePrefix(name+"-"), out)

		_, err = lv.Virsh(ctx, "destroy", "--graceful", domName)
		Expect(err).NotTo(HaveOccurred())
		Expect(lv.WaitForState(ctx, domName, testenv.StateShutOff)).To(Succeed())
		_, err = testenv.QemuImg(ctx, "convert", "-f", "qcow2", "-O", "raw", live(), expected(name))
		Expect(err).NotTo(HaveOccurred())
		return res.Type, res.BytesUploaded
	}

	restore := func(ctx context.Context, b string) string {
		target := filepath.Join(work, b+".restored.raw")
		_, err := repo.Restore(ctx, backup.RestoreOptions{Backup: b, VM: vm, Disk: "vda", Target: target, WorkDir: work})
		Expect(err).NotTo(HaveOccurred())
		return target
	}

	It("takes a full backup, then incrementals holding only the guest's new writes", func(ctx SpecContext) {
		kind, full := runGuest(ctx, 0, "b1")
		Expect(kind).To(Equal("full"))
		kind, inc1 := runGuest(ctx, 1, "b2")
		Expect(kind).To(Equal("incremental"))
		kind, inc2 := runGuest(ctx, 2, "b3")
		Expect(kind).To(Equal("incremental"))
		By(fmt.Sprintf("uploaded: full %d, incrementals %d and %d bytes", full, inc1, inc2))
		Expect(full).To(BeNumerically(">", 8*mib))
		Expect(inc1).To(BeNumerically("<", 2*mib), "1 MiB of guest writes")
		Expect(inc2).To(BeNumerically("<", 1536<<10), "512 KiB of guest writes")

		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		chain, err := idx.Chain(idx.Latest()[0].ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(chain).To(HaveLen(3))
	}, NodeTimeout(10*time.Minute))

	DescribeTable("restores each backup to the disk as it was at its checkpoint",
		func(ctx SpecContext, b string, rounds []int) {
			target := restore(ctx, b)
			same, err := qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, expected(b), "")
			Expect(err).NotTo(HaveOccurred())
			Expect(same).To(BeTrue(), "restored %s differs from the live disk at its checkpoint", b)
			for _, r := range rounds {
				p := guestRounds[r]
				data, err := testenv.ReadSectors(ctx, target, "raw", p.StartLBA, uint64(p.Sectors))
				Expect(err).NotTo(HaveOccurred())
				Expect(testenv.VerifyGuestData(data, p.StartLBA, p.Seed)).To(Succeed())
			}
		},
		Entry("the full one", "b1", []int{0}, NodeTimeout(5*time.Minute)),
		Entry("the first incremental", "b2", []int{1}, NodeTimeout(5*time.Minute)),
		Entry("the second incremental", "b3", []int{1, 2}, NodeTimeout(5*time.Minute)),
	)

	It("takes a full backup again when asked to", func(ctx SpecContext) {
		kind, _ := runGuest(ctx, 2, "b4", "-force-full")
		Expect(kind).To(Equal("full"))
		same, err := qcow2.Tool{}.Compare(ctx, restore(ctx, "b4"), qcow2.FormatRaw, expected("b4"), "")
		Expect(err).NotTo(HaveOccurred())
		Expect(same).To(BeTrue())
	}, NodeTimeout(5*time.Minute))
})
