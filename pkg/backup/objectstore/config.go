package objectstore

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Config locates a bucket the way a Velero BackupStorageLocation of the aws
// provider does: spec.objectStorage.{bucket,prefix} and spec.config.{region,
// s3Url,s3ForcePathStyle,profile,insecureSkipTLSVerify}, with the
// credentials in a file of the AWS shared-credentials format, as Velero's
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
	// Profile names the section of the credentials file; empty means
	// "default".
	Profile string
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

// ParseBSL decodes a BackupStorageLocation manifest.
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
	cfg := Config{
		Bucket:  obj.Spec.ObjectStorage.Bucket,
		Prefix:  obj.Spec.ObjectStorage.Prefix,
		Region:  obj.Spec.Config["region"],
		S3URL:   obj.Spec.Config["s3Url"],
		Profile: obj.Spec.Config["profile"],
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
