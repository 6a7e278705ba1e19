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

package datamover

import (
	"context"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// testCABundle is a self-signed certificate authority (ECDSA P-256).
const testCABundle = `-----BEGIN CERTIFICATE-----
MIIBcDCCARWgAwIBAgIBATAKBggqhkjOPQQDAjAeMRwwGgYDVQQDExNvYmplY3Rz
dG9yZSB0ZXN0IENBMCAXDTI1MDEwMTAwMDAwMFoYDzIxMjUwMTAxMDAwMDAwWjAe
MRwwGgYDVQQDExNvYmplY3RzdG9yZSB0ZXN0IENBMFkwEwYHKoZIzj0CAQYIKoZI
zj0DAQcDQgAELeqx8lWwEqXA/MDmQbC37O+dYUEoZM7NqVbXDXWsXjERNI9GoNMc
sSZsPUJwgwDICu8kH6jgXKQ6SG/8kYSfaqNCMEAwDgYDVR0PAQH/BAQDAgIEMA8G
A1UdEwEB/wQFMAMBAf8wHQYDVR0OBBYEFBKwgHZuN8ji6HlT2GIr0fXE0scUMAoG
CCqGSM49BAMCA0kAMEYCIQCckn51kRPRnq78NTroS/iUF7cmB2EoiZLmsP99h/ZE
kAIhAK9G9pl/CSibJRq8Y0gh9HHzuVmXTxj2Yr9cjElT9TOw
-----END CERTIFICATE-----
`

var _ = Describe("a backup storage location", func() {
	var (
		ctx context.Context
		c   client.Client
		bsl *velerov1.BackupStorageLocation
	)
	BeforeEach(func() {
		ctx = context.Background()
		scheme, err := NewScheme()
		Expect(err).NotTo(HaveOccurred())
		c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "cloud-credentials"},
			Data:       map[string][]byte{"cloud": []byte("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")},
		}).Build()
		bsl = &velerov1.BackupStorageLocation{
			ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "default"},
			Spec: velerov1.BackupStorageLocationSpec{
				Provider: "aws",
				StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{
					Bucket: "vm-backups", Prefix: "velero", CACert: []byte(testCABundle)}},
				Config: map[string]string{"region": "us-east-1", "s3Url": "https://s3.example.test", "s3ForcePathStyle": "true"},
			},
		}
	})

	It("is opened with its credentials in memory: the controller's root is read-only, without /tmp", func() {
		GinkgoT().Setenv("TMPDIR", filepath.Join(GinkgoT().TempDir(), "no-such-directory"))
		loc, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(err).NotTo(HaveOccurred())
		repo, err := loc.open()
		Expect(err).NotTo(HaveOccurred())
		Expect(repo).NotTo(BeNil())
	})

	It("hands its CA bundle to the pods", func() {
		loc, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(err).NotTo(HaveOccurred())
		cfg, err := objectstore.ParseBSL(loc.manifest)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(cfg.CACert)).To(Equal(testCABundle))
	})

	It("fails the operation on a config key the datamover does not understand, naming it", func() {
		bsl.Spec.Config["storageClass"] = "GLACIER"
		_, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(isFatal(err)).To(BeTrue())
		Expect(err).To(MatchError(ContainSubstring(`backup storage location default: spec.config: key "storageClass" is not supported by the KubeVirt datamover`)))
	})

	It("hands the keys of Velero's aws plugin to the pods", func() {
		bsl.Spec.Config["checksumAlgorithm"] = "SHA256"
		bsl.Spec.Config["serverSideEncryption"] = "AES256"
		loc, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(err).NotTo(HaveOccurred())
		cfg, err := objectstore.ParseBSL(loc.manifest)
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.ChecksumAlgorithm).To(Equal("SHA256"))
		Expect(cfg.ServerSideEncryption).To(Equal("AES256"))
	})

	It("is read from the cluster with its credentials, whatever its phase, for qcow2-backup", func() {
		Expect(c.Create(ctx, bsl)).To(Succeed())
		cfg, err := LocationConfig(ctx, c, "velero", "default")
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.Bucket).To(Equal("vm-backups"))
		Expect(string(cfg.CACert)).To(Equal(testCABundle))
		Expect(string(cfg.CredentialsData)).To(ContainSubstring("aws_access_key_id = AK"))
		_, err = LocationConfig(ctx, c, "velero", "other")
		Expect(err).To(MatchError(ContainSubstring(`backup storage location velero/other: backupstoragelocations.velero.io "other" not found`)))
	})

	It("knows the token file of a web identity in its credentials' profile, and refuses a profile they lack", func() {
		Expect(c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "sts"},
			Data: map[string][]byte{"credentials": []byte("[backup]\nrole_arn = arn:aws:iam::123456789012:role/velero\n" +
				"web_identity_token_file = /var/run/secrets/openshift/serviceaccount/token\n")}})).To(Succeed())
		bsl.Spec.Credential = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sts"}, Key: "credentials"}
		bsl.Spec.Config["profile"] = "backup"
		loc, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(err).NotTo(HaveOccurred())
		Expect(loc.tokenFile).To(Equal("/var/run/secrets/openshift/serviceaccount/token"))

		bsl.Spec.Config["profile"] = "other"
		_, err = usableLocation(ctx, c, bsl, time.Second)
		Expect(isFatal(err)).To(BeTrue())
		Expect(err).To(MatchError(`backup storage location default, secret sts key "credentials": credentials: profile "other" not found`))
	})

	DescribeTable("refuses a web identity token file its pods could not be given",
		func(file, message string) {
			Expect(c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "sts"},
				Data: map[string][]byte{"cloud": []byte("[default]\nrole_arn = arn:aws:iam::123456789012:role/velero\n" +
					"web_identity_token_file = " + file + "\n")}})).To(Succeed())
			bsl.Spec.Credential = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sts"}, Key: "cloud"}
			_, err := usableLocation(ctx, c, bsl, time.Second)
			Expect(isFatal(err)).To(BeTrue())
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("a relative path", "token", `web_identity_token_file "token" is not a file in a directory of its own`),
		Entry("a file in /", "/token", `web_identity_token_file "/token" is not a file in a directory of its own`),
		Entry("over the pods' credentials", "/var/run/datamover/credentials/token", "would be mounted over /var/run/datamover"),
		Entry("over a system directory", "/etc/token", "would be mounted over /etc"),
		Entry("above the pods' volumes", "/var/lib/token", "would be mounted over /var/lib/datamover"),
	)

	It("waits for credentials that are not there yet", func() {
		bsl.Spec.Credential = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "later"}, Key: "cloud"}
		_, err := usableLocation(ctx, c, bsl, time.Second)
		Expect(isFatal(err)).To(BeFalse())
		var wait *errWait
		Expect(err).To(BeAssignableToTypeOf(wait))
		Expect(err).To(MatchError(ContainSubstring("waiting: credentials of backup storage location default")))
	})
})
