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
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

var _ = Describe("an HTTPS object store signed by a private authority", func() {
	It("is trusted through the location's caCert, and refused without it with the x509 error", func(ctx SpecContext) {
		srv, err := s3server.StartTLS(ctx, s3Binary, GinkgoT().TempDir())
		framework.Require(err, "the S3 server (versitygw) over HTTPS")
		DeferCleanup(srv.Stop)
		work := GinkgoT().TempDir()
		credsFile, err := srv.WriteCredentials(work)
		Expect(err).NotTo(HaveOccurred())
		creds, err := os.ReadFile(credsFile)
		Expect(err).NotTo(HaveOccurred())

		By("the location's caCert, credentials in memory as the controller holds them")
		cfg, err := objectstore.ParseBSL([]byte(srv.BSL("backups", "velero")))
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.CACert).To(Equal(srv.CACert))
		Expect(cfg.S3URL).To(HavePrefix("https://"))
		cfg.CredentialsData = creds
		store, err := objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.CreateBucket(ctx)).To(Succeed())
		Expect(store.Check(ctx)).To(Succeed())

		By("a backup and its restore over HTTPS")
		vm := roundTrip(ctx, cfg, work)

		By("the same location without caCert")
		cfg.CACert = nil
		untrusted, err := objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
		err = untrusted.Check(ctx)
		Expect(err).To(MatchError(ContainSubstring("x509: certificate signed by unknown authority")))
		Expect(err).To(MatchError(ContainSubstring("spec.objectStorage.caCert")))
		repo, err := backup.Open(cfg)
		Expect(err).NotTo(HaveOccurred())
		_, err = repo.Index(ctx, vm)
		Expect(err).To(MatchError(ContainSubstring("x509: certificate signed by unknown authority")))
	})
})
