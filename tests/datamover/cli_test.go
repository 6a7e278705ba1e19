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

package datamover_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

var _ = Describe("qcow2-backup with a location of the cluster", func() {
	It("reads the BackupStorageLocation by name, with its secret and caCert, through a kubeconfig", func(ctx context.Context) {
		bin, err := testenv.BuildCommand(ctx, "./cmd/qcow2-backup", GinkgoT().TempDir())
		Expect(err).NotTo(HaveOccurred())
		config := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
		Expect(os.WriteFile(config, kubeconfig, 0o600)).To(Succeed())

		srv, err := s3server.StartTLS(ctx, s3Binary, GinkgoT().TempDir())
		framework.Require(err, "the S3 server (versitygw) over HTTPS")
		DeferCleanup(srv.Stop)
		vm := newVM(ctx)
		loc := newLocationOn(ctx, srv, velerov1.BackupStorageLocationPhaseAvailable, srv.CACert)
		_, err = loc.repository().BackupVM(ctx, vm.catalogVM(), vm.hv, backup.BackupOptions{Backup: "sun", WorkDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())

		out, err := exec.CommandContext(ctx, bin, "list", "--bsl-name", loc.name, "--velero-namespace", veleroNamespace,
			"--kubeconfig", config, "-o", "json").Output()
		Expect(err).NotTo(HaveOccurred(), "%s", stderrOf(err))
		var listed struct {
			Backups []struct {
				Name string `json:"name"`
			} `json:"backups"`
			Checkpoints []struct {
				Namespace string `json:"namespace"`
				VM        string `json:"vm"`
				Type      string `json:"type"`
			} `json:"checkpoints"`
		}
		Expect(json.Unmarshal(out, &listed)).To(Succeed(), string(out))
		Expect(listed.Backups).To(HaveLen(1))
		Expect(listed.Backups[0].Name).To(Equal("sun"))
		Expect(listed.Checkpoints).To(HaveLen(1))
		Expect(listed.Checkpoints[0].Namespace).To(Equal(vm.namespace))
		Expect(listed.Checkpoints[0].Type).To(Equal("full"))

		_, err = exec.CommandContext(ctx, bin, "list", "--bsl-name", "nowhere", "--kubeconfig", config).Output()
		Expect(err).To(HaveOccurred())
		Expect(stderrOf(err)).To(ContainSubstring(`backup storage location velero/nowhere: backupstoragelocations.velero.io "nowhere" not found`))
	})
})

func stderrOf(err error) string {
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
		return string(exitErr.Stderr)
	}
	return ""
}
