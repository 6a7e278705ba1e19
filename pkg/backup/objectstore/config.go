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
	"crypto/x509"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Config locates a bucket the way a Velero BackupStorageLocation of the aws
// provider does: spec.objectStorage.{bucket,prefix,caCert} and the keys of
// spec.config (configKeys), with the credentials in the AWS
// shared-credentials format, as Velero's credentials secret holds them.
type Config struct {
	Bucket string
	// Prefix is the BSL's prefix: Velero's objects are under it, a store
	// made by NewS3 has its keys under it, and backup.Open puts the
	// datamover's beside it (catalog.Root).
	Prefix string
	Region string
	// S3URL is the endpoint (http:// or https://); empty means AWS.
	S3URL                 string
	S3ForcePathStyle      bool
	InsecureSkipTLSVerify bool
	// CACert is a PEM bundle of certificate authorities trusted for the
	// endpoint besides the system's (spec.objectStorage.caCert), as
	// Velero's aws plugin trusts them.
	CACert []byte
	// Profile names the section of the credentials file; empty means
	// "default".
	Profile string
	// ChecksumAlgorithm is the checksum the store is asked to check and
	// keep for every object and part written (spec.config.checksumAlgorithm):
	// one of Checksum's algorithms, or empty for none.
	ChecksumAlgorithm string
	// ServerSideEncryption is the store's encryption of what is written
	// (spec.config.serverSideEncryption: AES256, aws:kms or
	// aws:kms:dsse), with KMSKeyID the KMS key (spec.config.kmsKeyId,
	// which alone means aws:kms); both empty leave it to the bucket.
	ServerSideEncryption string
	KMSKeyID             string
	// Tags are set on every object written (spec.config.tagging).
	Tags map[string]string
	// CredentialsData is the content of a credentials file in AWS
	// shared-credentials format, held in memory; it is used instead of
	// CredentialsFile. Neither set means the environment's
	// (credentialsFor).
	CredentialsData []byte
	// CredentialsFile is in AWS shared-credentials format.
	CredentialsFile string
	// PartSize is the multipart chunk; it bounds upload memory. Zero
	// takes DefaultPartSize.
	PartSize int64
	// PartConcurrency is how many parts are in flight; memory is about
	// PartSize times this. Zero takes DefaultPartConcurrency.
	PartConcurrency int
}

// bslObject holds the fields of a velero.io/v1 BackupStorageLocation this
// package reads.
type bslObject struct {
	Kind string `json:"kind"`
	Spec struct {
		Provider      string `json:"provider"`
		ObjectStorage struct {
			Bucket string `json:"bucket"`
			Prefix string `json:"prefix"`
			CACert []byte `json:"caCert"`
		} `json:"objectStorage"`
		Config map[string]string `json:"config"`
	} `json:"spec"`
}

// LoadBSL reads a BackupStorageLocation manifest (YAML or JSON) and returns
// its object storage settings. credentialsFile is the content of the BSL's
// credential secret key, saved to a file.
func LoadBSL(path, credentialsFile string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read backup storage location %s: %w", path, err)
	}
	cfg, err := ParseBSL(data)
	if err != nil {
		return Config{}, fmt.Errorf("backup storage location %s: %w", path, err)
	}
	cfg.CredentialsFile = credentialsFile
	return cfg, nil
}

// configKeys are the keys of spec.config that Velero's aws object store
// plugin accepts (v1.14), and what each is to the datamover. Any other key
// is refused, naming it: a misspelt key asks for something nobody does.
var configKeys = map[string]bool{
	"region": true, "s3Url": true, "s3ForcePathStyle": true, "profile": true, "insecureSkipTLSVerify": true,
	"checksumAlgorithm": true, "serverSideEncryption": true, "kmsKeyId": true, "tagging": true,
	// Velero's signed download URLs use them; the datamover makes none.
	"publicUrl": true, "signatureVersion": true,
	// Lets Velero's AWS SDK read settings only the shared config file
	// holds; the datamover reads a profile's keys from the credentials.
	"enableSharedConfig": true,
	// Refused by checkConfigKeys, saying why.
	"credentialsFile": true, "customerKeyEncryptionFile": true, "customerKeyEncryptionSecret": true,
}

// unsupportedKeys are keys of the aws plugin the datamover cannot honour,
// and why.
var unsupportedKeys = map[string]string{
	"credentialsFile": "names a file of Velero's pod, which the datamover's pods do not have: " +
		"give the location its credentials secret in spec.credential instead",
	"customerKeyEncryptionFile": "server-side encryption with a customer-provided key (SSE-C) " +
		"is not supported by the KubeVirt datamover",
	"customerKeyEncryptionSecret": "server-side encryption with a customer-provided key (SSE-C) " +
		"is not supported by the KubeVirt datamover",
}

// ParseBSL decodes a BackupStorageLocation manifest. It refuses keys of
// spec.config it does not understand, naming them, and a caCert that holds
// no PEM certificate.
func ParseBSL(data []byte) (Config, error) {
	var obj bslObject
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return Config{}, fmt.Errorf("decode: %w", err)
	}
	if obj.Kind != "" && obj.Kind != "BackupStorageLocation" {
		return Config{}, fmt.Errorf("kind is %q, want BackupStorageLocation", obj.Kind)
	}
	if p := obj.Spec.Provider; p != "" && p != "aws" && p != "velero.io/aws" {
		return Config{}, fmt.Errorf("provider %q is not S3-compatible (want aws)", p)
	}
	if err := checkConfigKeys(obj.Spec.Config); err != nil {
		return Config{}, err
	}
	cfg := Config{
		Bucket:               obj.Spec.ObjectStorage.Bucket,
		Prefix:               obj.Spec.ObjectStorage.Prefix,
		CACert:               obj.Spec.ObjectStorage.CACert,
		Region:               obj.Spec.Config["region"],
		S3URL:                obj.Spec.Config["s3Url"],
		Profile:              obj.Spec.Config["profile"],
		ChecksumAlgorithm:    obj.Spec.Config["checksumAlgorithm"],
		ServerSideEncryption: obj.Spec.Config["serverSideEncryption"],
		KMSKeyID:             obj.Spec.Config["kmsKeyId"],
	}
	if len(cfg.CACert) > 0 {
		if _, err := certPool(cfg.CACert); err != nil {
			return Config{}, err
		}
	}
	var err error
	if cfg.S3ForcePathStyle, err = parseBool(obj.Spec.Config, "s3ForcePathStyle"); err != nil {
		return Config{}, err
	}
	if cfg.InsecureSkipTLSVerify, err = parseBool(obj.Spec.Config, "insecureSkipTLSVerify"); err != nil {
		return Config{}, err
	}
	if _, err = parseBool(obj.Spec.Config, "enableSharedConfig"); err != nil {
		return Config{}, err
	}
	if cfg.Tags, err = parseTags(obj.Spec.Config["tagging"]); err != nil {
		return Config{}, err
	}
	if cfg.Bucket == "" {
		return Config{}, fmt.Errorf("spec.objectStorage.bucket is empty")
	}
	return cfg, nil
}

func checkConfigKeys(config map[string]string) error {
	var unknown []string
	for k := range config {
		if !configKeys[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		known := make([]string, 0, len(configKeys))
		for k := range configKeys {
			if _, refused := unsupportedKeys[k]; !refused {
				known = append(known, k)
			}
		}
		sort.Strings(known)
		what := "key %s is"
		if len(unknown) > 1 {
			what = "keys %s are"
		}
		return fmt.Errorf("spec.config: "+what+" not supported by the KubeVirt datamover (it understands %s)",
			quoteAll(unknown), strings.Join(known, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(config)) {
		if why, ok := unsupportedKeys[k]; ok {
			return fmt.Errorf("spec.config.%s: %s", k, why)
		}
	}
	if v := config["signatureVersion"]; v != "" && v != "1" && v != "4" {
		return fmt.Errorf("spec.config.signatureVersion: %q is no signature version (1 or 4)", v)
	}
	// Velero's plugin asks for CRC32 when the key is absent; the datamover
	// asks for none then: each part it sends is signed with its SHA-256,
	// which the store checks, and each object's SHA-256 is kept beside it
	// for readers (PutOptions.SHA256).
	switch v := config["checksumAlgorithm"]; v {
	case "":
	case "CRC64NVME":
		// S3 keeps it of a multipart object only as one checksum of the
		// whole object, which the datamover's uploads do not compute.
		return fmt.Errorf("spec.config.checksumAlgorithm: %q is not supported by the KubeVirt datamover (CRC32, CRC32C, SHA1 and SHA256 are)", v)
	default:
		if _, ok := checksumTypes[v]; !ok {
			return fmt.Errorf("spec.config.checksumAlgorithm: %q is not one of %s", v, strings.Join(slices.Sorted(maps.Keys(checksumTypes)), ", "))
		}
	}
	switch v := config["serverSideEncryption"]; v {
	case "", "AES256", "aws:kms", "aws:kms:dsse":
	default:
		return fmt.Errorf("spec.config.serverSideEncryption: %q is not one of AES256, aws:kms, aws:kms:dsse", v)
	}
	if config["kmsKeyId"] != "" && config["serverSideEncryption"] == "AES256" {
		return fmt.Errorf("spec.config.kmsKeyId: a KMS key asks for aws:kms, serverSideEncryption asks for AES256")
	}
	return nil
}

// parseTags reads spec.config.tagging, tags as a URL query
// ("key1=value1&key2=value2"), as S3's x-amz-tagging carries them.
func parseTags(tagging string) (map[string]string, error) {
	if tagging == "" {
		return nil, nil
	}
	values, err := url.ParseQuery(tagging)
	if err != nil {
		return nil, fmt.Errorf("spec.config.tagging: %q is not key=value pairs joined by &: %w", tagging, err)
	}
	tags := make(map[string]string, len(values))
	for k, v := range values {
		if k == "" || len(v) != 1 {
			return nil, fmt.Errorf("spec.config.tagging: %q needs one value for each key", tagging)
		}
		tags[k] = v[0]
	}
	return tags, nil
}

func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, ", ")
}

// certPool is the system's trusted authorities and those of a PEM bundle.
func certPool(caCert []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(caCert) {
		return nil, fmt.Errorf("spec.objectStorage.caCert: no PEM certificate in %d bytes", len(caCert))
	}
	return pool, nil
}

func parseBool(config map[string]string, key string) (bool, error) {
	v, ok := config[key]
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("spec.config.%s: %q is not a boolean", key, v)
	}
	return b, nil
}
