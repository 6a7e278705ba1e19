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
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/backuptest"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2"
)

// buildCLI builds cmd/qcow2-backup for the spec.
func buildCLI(ctx context.Context) string {
	bin, err := testenv.BuildCommand(ctx, "./cmd/qcow2-backup", GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
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
		Expect(out).To(MatchRegexp(`prod/db\s+tue-cp\s+incremental\s+mon-cp\s+complete\s+\d+(\.\d+)? (B|KiB|MiB)\s+tue`))

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

		missing := filepath.Join(work, "none")
		_, stderr, err = cli(ctx, bin, "restore", "-vm", "db", "-target", target, "-s3-url", srv.URL, "-bucket", "backups", "-credentials", missing)
		Expect(err).To(HaveOccurred())
		Expect(strings.TrimSpace(stderr)).To(HavePrefix("qcow2-backup: credentials: open " + missing + ": no such file or directory"))
	})

	It("exits 0 on -h and refuses what it does not know, naming it", func(ctx SpecContext) {
		bin := buildCLI(ctx)
		for _, args := range [][]string{{"-h"}, {"--help"}, {}, {"list", "-h"}, {"delete", "--help"}, {"help", "gc"}} {
			out, stderr, err := cli(ctx, bin, args...)
			Expect(err).NotTo(HaveOccurred(), "%v: %s", args, stderr)
			Expect(out).To(ContainSubstring("Usage:"), "%v", args)
		}
		out, _, err := cli(ctx, bin, "-h")
		Expect(err).NotTo(HaveOccurred())
		for _, sub := range []string{"backup", "list", "restore", "delete", "gc"} {
			Expect(out).To(MatchRegexp(`(?m)^\s+`+sub+`\s`), "subcommand %s", sub)
		}
		_, stderr, err := cli(ctx, bin, "lsit")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`unknown command "lsit"`))
		_, stderr, err = cli(ctx, bin, "list", "-o", "xml")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`"xml": want table, json or yaml`))
		_, stderr, err = cli(ctx, bin, "delete")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`required flag(s) "backup" not set`))
	})

	It("prints listings as JSON or YAML and sizes for people, and dry-runs delete and gc", func(ctx SpecContext) {
		bin := buildCLI(ctx)
		work := GinkgoT().TempDir()
		srv := startS3(ctx)
		creds, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		bsl := filepath.Join(work, "bsl.yaml")
		Expect(os.WriteFile(bsl, []byte(srv.BSL("backups", "velero")), 0o600)).To(Succeed())
		repo := newRepository(ctx, srv.BSL("backups", "velero"), creds)
		storage := []string{"--bsl", bsl, "--credentials", creds}
		vm := catalog.VM{Namespace: "prod", Name: "db"}
		hv, err := backuptest.New(ctx, work, 16*mib)
		Expect(err).NotTo(HaveOccurred())
		for i, b := range []string{"mon", "tue"} {
			Expect(hv.Write(ctx, int64(i)*4*mib, 3*mib, byte(0x40+i))).To(Succeed())
			_, err := repo.BackupVM(ctx, vm, hv, backup.BackupOptions{Backup: b, Checkpoint: b + "-cp", WorkDir: work})
			Expect(err).NotTo(HaveOccurred())
		}
		idx, err := repo.Index(ctx, vm)
		Expect(err).NotTo(HaveOccurred())
		sizes := map[string]int64{}
		for _, c := range idx.Checkpoints {
			for _, f := range c.Files {
				sizes[c.ID] += f.Size
			}
		}

		By("list -o json and -o yaml")
		type listed struct {
			Backups []struct {
				Name string `json:"name"`
				VMs  []struct {
					Namespace  string `json:"namespace"`
					Name       string `json:"name"`
					Checkpoint string `json:"checkpoint"`
				} `json:"vms"`
			} `json:"backups"`
			Checkpoints []struct {
				Namespace    string   `json:"namespace"`
				VM           string   `json:"vm"`
				ID           string   `json:"id"`
				Type         string   `json:"type"`
				Parent       string   `json:"parent"`
				State        string   `json:"state"`
				Bytes        int64    `json:"bytes"`
				ReferencedBy []string `json:"referencedBy"`
			} `json:"checkpoints"`
		}
		out, stderr, err := cli(ctx, bin, append([]string{"list", "-o", "json"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		var asJSON listed
		Expect(json.Unmarshal([]byte(out), &asJSON)).To(Succeed(), out)
		Expect(asJSON.Backups).To(HaveLen(2))
		Expect(asJSON.Backups[1].Name).To(Equal("tue"))
		Expect(asJSON.Backups[1].VMs).To(HaveLen(1))
		Expect(asJSON.Backups[1].VMs[0].Checkpoint).To(Equal("tue-cp"))
		Expect(asJSON.Checkpoints).To(HaveLen(2))
		tue := asJSON.Checkpoints[1]
		Expect([]string{tue.Namespace, tue.VM, tue.ID, tue.Type, tue.Parent, tue.State}).To(Equal([]string{"prod", "db", "tue-cp", "incremental", "mon-cp", "complete"}))
		Expect(tue.Bytes).To(Equal(sizes["tue-cp"]))
		Expect(tue.ReferencedBy).To(Equal([]string{"tue"}))
		out, stderr, err = cli(ctx, bin, append([]string{"list", "-o", "yaml"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		var asYAML listed
		Expect(yaml.Unmarshal([]byte(out), &asYAML)).To(Succeed(), out)
		Expect(asYAML).To(Equal(asJSON))

		By("the table's sizes")
		out, _, err = cli(ctx, bin, append([]string{"list"}, storage...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(sizes["mon-cp"]).To(BeNumerically(">", 3*mib))
		Expect(out).To(MatchRegexp(`prod/db\s+mon-cp\s+full\s+-\s+complete\s+3\.\d MiB\s+mon,tue`))

		By("delete --dry-run reports what delete then removes, and removes nothing")
		keys := allKeys(ctx, repo.Store)
		out, stderr, err = cli(ctx, bin, append([]string{"delete", "--backup", "tue", "--dry-run"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(out).To(HavePrefix("dry run: deleting backup tue would remove 1 checkpoints, "))
		out, stderr, err = cli(ctx, bin, append([]string{"delete", "--backup", "tue", "--dry-run", "-o", "json"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		var dry, done struct {
			DryRun      bool     `json:"dryRun"`
			Checkpoints []string `json:"checkpoints"`
			Objects     []string `json:"objects"`
		}
		Expect(json.Unmarshal([]byte(out), &dry)).To(Succeed(), out)
		Expect(dry.DryRun).To(BeTrue())
		Expect(dry.Checkpoints).To(Equal([]string{"prod/db/tue-cp"}))
		Expect(dry.Objects).To(ContainElement(catalog.DiskPath(vm, "tue-cp", "tue", "vda")))
		Expect(allKeys(ctx, repo.Store)).To(Equal(keys))
		out, stderr, err = cli(ctx, bin, append([]string{"delete", "--backup", "tue", "-o", "json"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(json.Unmarshal([]byte(out), &done)).To(Succeed(), out)
		Expect(done.DryRun).To(BeFalse())
		Expect(done.Checkpoints).To(Equal(dry.Checkpoints))
		Expect(done.Objects).To(Equal(dry.Objects))
		Expect(allKeys(ctx, repo.Store)).NotTo(ContainElement(catalog.DiskPath(vm, "tue-cp", "tue", "vda")))

		By("gc --dry-run reports the object no index names, and keeps it")
		ghost := catalog.AttachmentPath(vm, "ghost", "x.qcow2")
		Expect(repo.Store.Put(ctx, ghost, strings.NewReader("x"), 1, objectstore.PutOptions{})).Error().NotTo(HaveOccurred())
		out, stderr, err = cli(ctx, bin, append([]string{"gc", "--grace", "-1s", "--dry-run"}, storage...)...)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(out).To(Equal("dry run: garbage collection would remove 0 checkpoints, 1 objects\n  object " + ghost + "\n"))
		Expect(allKeys(ctx, repo.Store)).To(ContainElement(ghost))
		out, _, err = cli(ctx, bin, append([]string{"gc", "--grace", "-1s"}, storage...)...)
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(HavePrefix("garbage collected: 0 checkpoints, 1 objects removed"))
		Expect(allKeys(ctx, repo.Store)).NotTo(ContainElement(ghost))
	})
})
