package backup_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// buildCLI builds cmd/qcow2-backup for the spec.
func buildCLI(ctx context.Context) string {
	bin := filepath.Join(GinkgoT().TempDir(), "qcow2-backup")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/qcow2-backup")
	cmd.Dir = framework.RepoRoot()
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
	return bin
}

// cli runs the command and returns its standard output and error.
func cli(ctx context.Context, bin string, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

var _ = Describe("the qcow2-backup command", func() {
	It("lists, restores, deletes and collects with a Velero BSL and credentials file", func(ctx SpecContext) {
		bin := buildCLI(ctx)
		work := GinkgoT().TempDir()
		srv := startS3(ctx)
		creds, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		bsl := filepath.Join(work, "bsl.yaml")
		Expect(os.WriteFile(bsl, []byte(srv.BSL("backups", "velero")), 0o600)).To(Succeed())
		repo := newRepository(ctx, srv.BSL("backups", "velero"), creds)
		storage := []string{"-bsl", bsl, "-credentials", creds}

		vm := catalog.VM{Namespace: "prod", Name: "db"}
		hv, err := backuptest.New(ctx, work, 16*mib)
		Expect(err).NotTo(HaveOccurred())
		expected := map[string]string{}
		for i, b := range []string{"mon", "tue"} {
			Expect(hv.Write(ctx, int64(i)*2*mib, mib, byte(0x40+i))).To(Succeed())
			_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: b, Checkpoint: b + "-cp", WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
			expected[b] = filepath.Join(work, b+".expected.raw")
			Expect(hv.Snapshot(ctx, expected[b])).To(Succeed())
		}

		out, _, err := cli(ctx, bin, append([]string{"list"}, storage...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(MatchRegexp(`tue\s+prod/db\s+tue-cp`))
		Expect(out).To(MatchRegexp(`prod/db\s+tue-cp\s+incremental\s+mon-cp\s+complete\s+\d+\s+tue`))

		target := filepath.Join(work, "mon.raw")
		out, stderr, err := cli(ctx, bin, append([]string{"restore", "-namespace", "prod", "-vm", "db", "-backup", "mon", "-target", target, "-work-dir", work}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(out).To(ContainSubstring("restored prod/db disk vda onto " + target + " from mon-cp"))
		Expect(stderr).To(ContainSubstring("download checkpoints/prod/db/mon-cp/mon-vda.qcow2: 100.0%"))
		Expect(qcow2.Tool{}.Compare(ctx, target, qcow2.FormatRaw, expected["mon"], "")).To(BeTrue())

		out, _, err = cli(ctx, bin, append([]string{"delete", "-backup", "tue"}, storage...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("deleted backup tue: 1 checkpoints"))

		_, stderr, err = cli(ctx, bin, append([]string{"restore", "-namespace", "prod", "-vm", "db", "-backup", "tue", "-target", target}, storage...)...)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("backup tue is not in the store"))

		out, _, err = cli(ctx, bin, append([]string{"gc", "-grace", "-1s"}, storage...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("garbage collected: 0 checkpoints, 0 objects removed"))

		_, stderr, err = cli(ctx, bin, "restore", "-vm", "db", "-target", target, "-s3-url", srv.URL, "-bucket", "backups", "-credentials", filepath.Join(work, "none"))
		Expect(err).To(HaveOccurred())
		Expect(strings.TrimSpace(stderr)).To(HavePrefix("qcow2-backup: open credentials"))
	})
})
