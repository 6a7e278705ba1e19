package objectstore_test

import (
	"strings"

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
	)

	DescribeTable("reads a profile of an AWS credentials file",
		func(file, profile string, want objectstore.Credentials, message string) {
			got, err := objectstore.ParseCredentials(strings.NewReader(file), profile)
			if message != "" {
				Expect(err).To(MatchError(ContainSubstring(message)))
				return
			}
			Expect(err).NotTo(HaveOccurred())
			Expect(got).To(Equal(want))
		},
		Entry("the default profile", "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n", "",
			objectstore.Credentials{AccessKeyID: "AK", SecretAccessKey: "SK"}, ""),
		Entry("a named profile among others, with a session token", "# velero\n[default]\naws_access_key_id=x\naws_secret_access_key=y\n\n[profile backup]\naws_access_key_id=AK\naws_secret_access_key=SK\naws_session_token=T\n", "backup",
			objectstore.Credentials{AccessKeyID: "AK", SecretAccessKey: "SK", SessionToken: "T"}, ""),
		Entry("a missing profile", "[default]\naws_access_key_id=x\naws_secret_access_key=y\n", "other",
			objectstore.Credentials{}, `profile "other" not found`),
		Entry("a profile without a secret", "[default]\naws_access_key_id=x\n", "",
			objectstore.Credentials{}, "lacks aws_access_key_id or aws_secret_access_key"),
		Entry("a malformed line", "[default]\njunk\n", "",
			objectstore.Credentials{}, "line 2"),
	)

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
