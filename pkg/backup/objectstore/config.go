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
	"bufio"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Config locates a bucket the way a Velero BackupStorageLocation of the aws
// provider does: spec.objectStorage.{bucket,prefix,caCert} and
// spec.config.{region,s3Url,s3ForcePathStyle,profile,insecureSkipTLSVerify},
// with the credentials in the AWS shared-credentials format, as Velero's
// credentials secret holds them.
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
	// CredentialsData is the content of a credentials file in AWS
	// shared-credentials format, held in memory; it is used instead of
	// CredentialsFile.
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

// Credentials are static S3 keys.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
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

// configKeys are the keys of spec.config that a location may hold: those
// Config reads, and those of Velero's aws plugin that change nothing the
// datamover does. Any other key (kmsKeyId, serverSideEncryption, tagging,
// checksumAlgorithm, …) asks for something the datamover would not do, and
// a misspelt key for something nobody does: the location is refused.
var configKeys = map[string]bool{
	"region": true, "s3Url": true, "s3ForcePathStyle": true, "profile": true, "insecureSkipTLSVerify": true,
	// Velero's signed download URLs use it; the datamover makes none.
	"publicUrl": true,
	// Only "4" (checked below): the datamover signs with version 4.
	"signatureVersion": true,
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
		Bucket:  obj.Spec.ObjectStorage.Bucket,
		Prefix:  obj.Spec.ObjectStorage.Prefix,
		CACert:  obj.Spec.ObjectStorage.CACert,
		Region:  obj.Spec.Config["region"],
		S3URL:   obj.Spec.Config["s3Url"],
		Profile: obj.Spec.Config["profile"],
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
			known = append(known, k)
		}
		sort.Strings(known)
		what := "key %s is"
		if len(unknown) > 1 {
			what = "keys %s are"
		}
		return fmt.Errorf("spec.config: "+what+" not supported by the KubeVirt datamover (it understands %s)",
			quoteAll(unknown), strings.Join(known, ", "))
	}
	if v := config["signatureVersion"]; v != "" && v != "4" {
		return fmt.Errorf("spec.config.signatureVersion: %q is not supported by the KubeVirt datamover: it signs with version 4", v)
	}
	return nil
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

// ReadCredentials reads one profile from a file in AWS shared-credentials
// format ("[profile]" sections of "key = value" lines).
func ReadCredentials(path, profile string) (Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("open credentials %s: %w", path, err)
	}
	defer f.Close()
	creds, err := ParseCredentials(f, profile)
	if err != nil {
		return Credentials{}, fmt.Errorf("credentials %s: %w", path, err)
	}
	return creds, nil
}

// ParseCredentials reads one profile of the AWS shared-credentials format.
func ParseCredentials(r io.Reader, profile string) (Credentials, error) {
	if profile == "" {
		profile = "default"
	}
	var creds Credentials
	section, found := "", false
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") || strings.HasPrefix(text, ";") {
			continue
		}
		if strings.HasPrefix(text, "[") && strings.HasSuffix(text, "]") {
			section = strings.TrimSpace(strings.TrimPrefix(text[1:len(text)-1], "profile "))
			found = found || section == profile
			continue
		}
		key, value, ok := strings.Cut(text, "=")
		if !ok {
			return Credentials{}, fmt.Errorf("line %d: not a key = value line", line)
		}
		if section != profile {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.ToLower(strings.TrimSpace(key)) {
		case "aws_access_key_id":
			creds.AccessKeyID = value
		case "aws_secret_access_key":
			creds.SecretAccessKey = value
		case "aws_session_token":
			creds.SessionToken = value
		}
	}
	if err := sc.Err(); err != nil {
		return Credentials{}, fmt.Errorf("read: %w", err)
	}
	if !found {
		return Credentials{}, fmt.Errorf("profile %q not found", profile)
	}
	if creds.AccessKeyID == "" || creds.SecretAccessKey == "" {
		return Credentials{}, fmt.Errorf("profile %q lacks aws_access_key_id or aws_secret_access_key", profile)
	}
	return creds, nil
}
