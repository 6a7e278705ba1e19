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

package objectstore_test

import (
	"encoding/base64"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

const bslYAML = `apiVersion: velero.io/v1
kind: BackupStorageLocation
metadata:
  name: default
  namespace: velero
spec:
  provider: aws
  objectStorage:
    bucket: vm-backups
    prefix: cluster-a
  config:
    region: minio
    s3Url: http://127.0.0.1:9000
    s3ForcePathStyle: "true"
    profile: backup
  credential:
    name: cloud-credentials
    key: cloud
`

var _ = Describe("backup storage location", func() {
	It("reads the object storage settings of a Velero BackupStorageLocation", func() {
		cfg, err := objectstore.ParseBSL([]byte(bslYAML))
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg).To(Equal(objectstore.Config{
			Bucket: "vm-backups", Prefix: "cluster-a", Region: "minio",
			S3URL: "http://127.0.0.1:9000", S3ForcePathStyle: true, Profile: "backup",
		}))
	})

	DescribeTable("refuses what it cannot use, naming the field",
		func(manifest, message string) {
			_, err := objectstore.ParseBSL([]byte(manifest))
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("another provider", "spec:\n  provider: gcp\n  objectStorage:\n    bucket: b\n", `provider "gcp"`),
		Entry("no bucket", "spec:\n  provider: aws\n", "spec.objectStorage.bucket is empty"),
		Entry("a flag that is no boolean", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    s3ForcePathStyle: maybe\n", "spec.config.s3ForcePathStyle"),
		Entry("another kind", "kind: Backup\nspec:\n  objectStorage:\n    bucket: b\n", "want BackupStorageLocation"),
		Entry("a key it does not know", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    region: r\n    storageClass: GLACIER\n",
			`spec.config: key "storageClass" is not supported by the KubeVirt datamover (it understands checksumAlgorithm, `+
				`enableSharedConfig, insecureSkipTLSVerify, kmsKeyId, profile, publicUrl, region, s3ForcePathStyle, s3Url, `+
				`serverSideEncryption, signatureVersion, tagging)`),
		Entry("a customer-provided key", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    customerKeyEncryptionSecret: sse-key/key\n",
			"spec.config.customerKeyEncryptionSecret: server-side encryption with a customer-provided key (SSE-C) is not supported"),
		Entry("a credentials file of Velero's pod", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    credentialsFile: /credentials/cloud\n",
			"spec.config.credentialsFile: names a file of Velero's pod"),
		Entry("misspelt config keys", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    s3URL: https://s3.example.test\n    regoin: r\n",
			`spec.config: keys "regoin", "s3URL" are not supported`),
		Entry("no signature version", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    signatureVersion: \"2\"\n",
			`spec.config.signatureVersion: "2" is no signature version (1 or 4)`),
		Entry("no checksum algorithm", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    checksumAlgorithm: MD5\n",
			`spec.config.checksumAlgorithm: "MD5" is not one of CRC32, CRC32C, CRC64NVME, SHA1, SHA256`),
		Entry("a checksum kept only of whole objects", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    checksumAlgorithm: CRC64NVME\n",
			`spec.config.checksumAlgorithm: "CRC64NVME" is not supported by the KubeVirt datamover`),
		Entry("no encryption S3 knows", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    serverSideEncryption: rot13\n",
			`spec.config.serverSideEncryption: "rot13" is not one of AES256, aws:kms, aws:kms:dsse`),
		Entry("a KMS key with AES256", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    serverSideEncryption: AES256\n    kmsKeyId: alias/backups\n",
			"spec.config.kmsKeyId: a KMS key asks for aws:kms"),
		Entry("tags that are no query", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    tagging: a=1;b=%zz\n",
			"spec.config.tagging"),
		Entry("shared config that is no boolean", "spec:\n  objectStorage:\n    bucket: b\n  config:\n    enableSharedConfig: yes please\n",
			"spec.config.enableSharedConfig"),
		Entry("a caCert that holds no certificate", "spec:\n  objectStorage:\n    bucket: b\n    caCert: bm90IGEgY2VydGlmaWNhdGU=\n",
			"spec.objectStorage.caCert: no PEM certificate in 17 bytes"),
	)

	It("reads what the aws plugin's keys ask of every write", func() {
		cfg, err := objectstore.ParseBSL([]byte("spec:\n  objectStorage:\n    bucket: b\n  config:\n" +
			"    checksumAlgorithm: SHA256\n    serverSideEncryption: aws:kms\n    kmsKeyId: alias/backups\n" +
			"    tagging: team=storage&tier=backup\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg).To(Equal(objectstore.Config{Bucket: "b", ChecksumAlgorithm: "SHA256",
			ServerSideEncryption: "aws:kms", KMSKeyID: "alias/backups",
			Tags: map[string]string{"team": "storage", "tier": "backup"}}))
	})

	// OADP's operator writes checksumAlgorithm "" into every aws location
	// it manages (UpdateBackupStorageLocation), and strips an endpoint's
	// default port; its CloudStorage locations on STS add
	// enableSharedConfig.
	DescribeTable("reads the locations OADP's operator makes",
		func(config string, want objectstore.Config) {
			cfg, err := objectstore.ParseBSL([]byte("apiVersion: velero.io/v1\nkind: BackupStorageLocation\n" +
				"metadata:\n  name: dpa-sample-1\n  namespace: openshift-adp\n" +
				"spec:\n  provider: aws\n  default: true\n  objectStorage:\n    bucket: b\n    prefix: velero\n" +
				"  credential:\n    name: cloud-credentials\n    key: cloud\n  config:\n" + config))
			Expect(err).NotTo(HaveOccurred())
			want.Bucket, want.Prefix = "b", "velero"
			Expect(cfg).To(Equal(want))
		},
		Entry("AWS", "    region: us-east-1\n    profile: default\n    checksumAlgorithm: \"\"\n",
			objectstore.Config{Region: "us-east-1", Profile: "default"}),
		Entry("an S3-compatible store", "    region: minio\n    profile: default\n    s3Url: https://minio.example.test\n"+
			"    s3ForcePathStyle: \"true\"\n    insecureSkipTLSVerify: \"true\"\n    checksumAlgorithm: \"\"\n",
			objectstore.Config{Region: "minio", Profile: "default", S3URL: "https://minio.example.test",
				S3ForcePathStyle: true, InsecureSkipTLSVerify: true}),
		Entry("AWS through STS", "    region: us-east-2\n    enableSharedConfig: \"true\"\n    checksumAlgorithm: \"\"\n",
			objectstore.Config{Region: "us-east-2"}),
	)

	It("reads the location's CA bundle and the aws plugin's keys that change nothing here", func() {
		cfg, err := objectstore.ParseBSL([]byte("spec:\n  objectStorage:\n    bucket: b\n    caCert: " +
			base64.StdEncoding.EncodeToString([]byte(testCA)) + "\n  config:\n    s3Url: https://s3.example.test\n" +
			"    publicUrl: https://public.example.test\n    signatureVersion: \"1\"\n"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(cfg.CACert)).To(Equal(testCA))
		_, err = objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
	})

	It("takes credentials from memory", func() {
		cfg := objectstore.Config{Bucket: "b", S3URL: "http://127.0.0.1:9000", Profile: "backup",
			CredentialsData: []byte("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")}
		_, err := objectstore.NewS3(cfg)
		Expect(err).To(MatchError(`credentials: profile "backup" not found`))
		cfg.Profile = ""
		_, err = objectstore.NewS3(cfg)
		Expect(err).NotTo(HaveOccurred())
	})

	DescribeTable("accepts only endpoints it can reach",
		func(url, message string) {
			_, err := objectstore.NewS3(objectstore.Config{Bucket: "b", S3URL: url})
			if message == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(MatchError(ContainSubstring(message)))
		},
		Entry("http on loopback", "http://127.0.0.1:9000", ""),
		Entry("https with a port", "https://s3.example.test:443", ""),
		Entry("no scheme", "127.0.0.1:9000", "scheme"),
		Entry("a path", "http://127.0.0.1:9000/bucket", "without a path"),
	)
})

// testCA is a self-signed certificate authority (ECDSA P-256).
const testCA = `-----BEGIN CERTIFICATE-----
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
