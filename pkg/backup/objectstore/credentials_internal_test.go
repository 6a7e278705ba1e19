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

package objectstore

import (
	"os"
	"path/filepath"

	"github.com/minio/minio-go/v7/pkg/credentials"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/sts"
)

var _ = Describe("a location's credentials", func() {
	keysOf := func(cfg Config) (credentials.Value, error) {
		creds, err := credentialsFor(cfg)
		if err != nil {
			return credentials.Value{}, err
		}
		return creds.GetWithContext(nil)
	}

	DescribeTable("are a profile's keys, in memory or in a file",
		func(content, profile string, want credentials.Value) {
			file := filepath.Join(GinkgoT().TempDir(), "credentials")
			Expect(os.WriteFile(file, []byte(content), 0o600)).To(Succeed())
			for _, cfg := range []Config{{CredentialsData: []byte(content), Profile: profile}, {CredentialsFile: file, Profile: profile}} {
				got, err := keysOf(cfg)
				Expect(err).NotTo(HaveOccurred())
				Expect(got.AccessKeyID).To(Equal(want.AccessKeyID))
				Expect(got.SecretAccessKey).To(Equal(want.SecretAccessKey))
				Expect(got.SessionToken).To(Equal(want.SessionToken))
			}
		},
		Entry("the default profile", "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n", "",
			credentials.Value{AccessKeyID: "AK", SecretAccessKey: "SK"}),
		Entry("a named profile among others, with a session token and comments",
			"# velero\n[default]\naws_access_key_id=x\naws_secret_access_key=y\n\n; backups\n[backup]\naws_access_key_id=AK\naws_secret_access_key=SK\naws_session_token=T\n", "backup",
			credentials.Value{AccessKeyID: "AK", SecretAccessKey: "SK", SessionToken: "T"}),
		Entry("a profile of an AWS config file", "[profile backup]\naws_access_key_id = AK\naws_secret_access_key = SK\n", "backup",
			credentials.Value{AccessKeyID: "AK", SecretAccessKey: "SK"}),
	)

	DescribeTable("are refused, saying why, when they cannot sign",
		func(content, profile, message string) {
			_, err := credentialsFor(Config{CredentialsData: []byte(content), Profile: profile})
			Expect(err).To(MatchError(message))
		},
		Entry("a missing profile", "[default]\naws_access_key_id=x\naws_secret_access_key=y\n", "other",
			`credentials: profile "other" not found`),
		Entry("a profile without a secret", "[default]\naws_access_key_id=x\n", "",
			`credentials: profile "default" has neither aws_access_key_id and aws_secret_access_key nor role_arn and web_identity_token_file`),
		Entry("a web identity without its token", "[default]\nrole_arn = arn:aws:iam::123456789012:role/velero\n", "",
			`credentials: profile "default": a web identity needs both role_arn and web_identity_token_file`),
	)

	It("exchange a web identity's token at STS, as OADP on STS writes the profile, reading the token again when it renews", func() {
		server := sts.Start("AK", "SK")
		DeferCleanup(server.Close)
		GinkgoT().Setenv(EnvSTSEndpoint, server.URL)
		dir := GinkgoT().TempDir()
		token := filepath.Join(dir, "token")
		Expect(os.WriteFile(token, []byte("first-token"), 0o600)).To(Succeed())
		profile := "[default]\nsts_regional_endpoints = regional\nrole_arn = arn:aws:iam::123456789012:role/velero\n" +
			"web_identity_token_file = " + token + "\n"

		creds, err := credentialsFor(Config{CredentialsData: []byte(profile), Region: "us-east-1"})
		Expect(err).NotTo(HaveOccurred())
		got, err := creds.GetWithContext(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.AccessKeyID).To(Equal("AK"))
		Expect(got.SecretAccessKey).To(Equal("SK"))
		Expect(server.Requests()).To(ConsistOf(sts.Request{RoleARN: "arn:aws:iam::123456789012:role/velero",
			RoleSessionName: server.Requests()[0].RoleSessionName, Token: "first-token"}))

		// kubelet rotates the projected token; the next exchange reads it.
		Expect(os.WriteFile(token, []byte("second-token"), 0o600)).To(Succeed())
		creds.Expire()
		_, err = creds.GetWithContext(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(server.Requests()).To(HaveLen(2))
		Expect(server.Requests()[1].Token).To(Equal("second-token"))
	})

	It("are the environment's without a credentials secret", func() {
		GinkgoT().Setenv("AWS_ACCESS_KEY_ID", "ENVAK")
		GinkgoT().Setenv("AWS_SECRET_ACCESS_KEY", "ENVSK")
		got, err := keysOf(Config{})
		Expect(err).NotTo(HaveOccurred())
		Expect(got.AccessKeyID).To(Equal("ENVAK"))
		Expect(got.SecretAccessKey).To(Equal("ENVSK"))
	})
})
