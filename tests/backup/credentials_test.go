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
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/sts"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// The test S3 server has no STS: a stand-in on loopback exchanges the web
// identity for the server's keys, and the server checks every request
// signed with them.
var _ = Describe("a location whose credentials are a web identity", func() {
	It("backs up and restores with the keys STS exchanged for the token file the profile names", func(ctx SpecContext) {
		srv := startS3(ctx)
		exchange := sts.Start(srv.AccessKey, srv.SecretKey)
		DeferCleanup(exchange.Close)
		GinkgoT().Setenv(objectstore.EnvSTSEndpoint, exchange.URL)
		work := GinkgoT().TempDir()
		token := filepath.Join(work, "token")
		Expect(os.WriteFile(token, []byte("projected-service-account-token"), 0o600)).To(Succeed())
		credentials := filepath.Join(work, "credentials")
		Expect(os.WriteFile(credentials, []byte("[default]\nsts_regional_endpoints = regional\n"+
			"role_arn = arn:aws:iam::123456789012:role/velero\nweb_identity_token_file = "+token+"\n"), 0o600)).To(Succeed())

		cfg := srv.Config("backups", "velero", credentials)
		store, err := objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(store.CreateBucket(ctx)).To(Succeed())
		roundTrip(ctx, cfg, work)
		Expect(exchange.Requests()).NotTo(BeEmpty())
		for _, r := range exchange.Requests() {
			Expect(r.RoleARN).To(Equal("arn:aws:iam::123456789012:role/velero"))
			Expect(r.Token).To(Equal("projected-service-account-token"))
		}

		By("a token the STS does not take: the store says so")
		Expect(os.WriteFile(token, nil, 0o600)).To(Succeed())
		refused, err := objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(refused.Check(ctx)).To(MatchError(ContainSubstring("missing WebIdentityToken")))
	})
})
