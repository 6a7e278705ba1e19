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
	"fmt"
	"os"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"gopkg.in/ini.v1"
)

// EnvSTSEndpoint overrides the STS endpoint a web identity is exchanged
// at, as it does for the AWS SDKs (and so for Velero's aws plugin).
const EnvSTSEndpoint = "AWS_ENDPOINT_URL_STS"

// credentialsFor is what signs the requests of a store of cfg, through
// minio-go's providers. A location's credentials (cfg.CredentialsData, or
// cfg.CredentialsFile) are a profile of the AWS shared credentials format,
// as Velero's credentials secret holds them:
//   - role_arn and web_identity_token_file: a web identity (a projected
//     service account token, as OADP on STS and EKS's IRSA write it),
//     exchanged at STS for keys that are renewed before they expire;
//   - otherwise the profile's keys (aws_access_key_id,
//     aws_secret_access_key, aws_session_token); from a file, also what
//     minio-go's file provider reads besides (credential_process, SSO).
//
// Without them, the environment's: the AWS_* keys, the shared
// credentials file, then a web identity (AWS_ROLE_ARN,
// AWS_WEB_IDENTITY_TOKEN_FILE), ECS or EC2 instance metadata.
func credentialsFor(cfg Config) (*credentials.Credentials, error) {
	var source any
	switch {
	case len(cfg.CredentialsData) > 0:
		source = cfg.CredentialsData
	case cfg.CredentialsFile != "":
		source = cfg.CredentialsFile
	default:
		return credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{},
			&credentials.FileAWSCredentials{Profile: cfg.Profile},
			&credentials.IAM{Region: cfg.Region, Endpoint: os.Getenv(EnvSTSEndpoint)},
		}), nil
	}
	profile, key, err := profileKeys(source, cfg.Profile)
	if err != nil {
		return nil, err
	}
	if role, token := key("role_arn"), key("web_identity_token_file"); role != "" || token != "" {
		if role == "" || token == "" {
			return nil, fmt.Errorf("credentials: profile %q: a web identity needs both role_arn and web_identity_token_file", profile)
		}
		return webIdentity(cfg.Region, role, key("role_session_name"), token), nil
	}
	keys := key("aws_access_key_id") != "" && key("aws_secret_access_key") != ""
	if file, ok := source.(string); ok && (keys || key("credential_process") != "" ||
		key("sso_session") != "" || key("sso_start_url") != "") {
		return credentials.NewFileAWSCredentials(file, profile), nil
	}
	if !keys {
		return nil, fmt.Errorf("credentials: profile %q has neither aws_access_key_id and aws_secret_access_key "+
			"nor role_arn and web_identity_token_file", profile)
	}
	return credentials.NewStaticV4(key("aws_access_key_id"), key("aws_secret_access_key"), key("aws_session_token")), nil
}

// profileKeys reads the profile of a credentials file's content or path
// ("default" when profile is empty), returning its name and its keys.
func profileKeys(source any, profile string) (string, func(name string) string, error) {
	if profile == "" {
		profile = "default"
	}
	profiles, err := ini.Load(source)
	if err != nil {
		return profile, nil, fmt.Errorf("credentials: %w", err)
	}
	section, err := profiles.GetSection(profile)
	if err != nil {
		// AWS config files name profiles "profile NAME".
		if section, err = profiles.GetSection("profile " + profile); err != nil {
			return profile, nil, fmt.Errorf("credentials: profile %q not found", profile)
		}
	}
	return profile, func(name string) string { return section.Key(name).String() }, nil
}

// WebIdentityTokenFile is the token file the profile of credentials (a
// credentials file's content) names for a web identity; empty when it
// names none. Whoever runs a process for the location gives it that file.
func WebIdentityTokenFile(credentials []byte, profile string) (string, error) {
	_, key, err := profileKeys(credentials, profile)
	if err != nil {
		return "", err
	}
	return key("web_identity_token_file"), nil
}

// webIdentity exchanges the token in tokenFile, read again at every
// renewal (kubelet rotates projected tokens), for keys of role at the STS
// endpoint of region, or EnvSTSEndpoint's.
func webIdentity(region, role, session, tokenFile string) *credentials.Credentials {
	return credentials.New(&credentials.IAM{
		Region:   region,
		Endpoint: os.Getenv(EnvSTSEndpoint),
		EKSIdentity: struct {
			TokenFile       string
			RoleARN         string
			RoleSessionName string
		}{tokenFile, role, session},
	})
}
