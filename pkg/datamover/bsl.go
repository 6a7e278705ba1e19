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
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// Velero's default credentials secret, used when a location names none.
const (
	defaultCredentialsSecret = "cloud-credentials"
	defaultCredentialsKey    = "cloud"
)

// location is a backup storage location ready for use.
type location struct {
	bsl *velerov1.BackupStorageLocation
	// manifest is the location's object storage settings as
	// objectstore.ParseBSL reads them.
	manifest    []byte
	credentials []byte
	// secret is where the credentials are, in the location's namespace.
	secret secretKey
	// tokenFile is where the credentials' profile reads a web identity
	// token from, which the pods are given; empty for keys.
	tokenFile string
}

// bslManifest renders what a pod needs of a location: provider, bucket,
// prefix, CA bundle and config, no status or metadata.
func bslManifest(bsl *velerov1.BackupStorageLocation) ([]byte, error) {
	spec := map[string]any{"provider": bsl.Spec.Provider, "config": bsl.Spec.Config}
	if os := bsl.Spec.ObjectStorage; os != nil {
		storage := map[string]any{"bucket": os.Bucket, "prefix": os.Prefix}
		if len(os.CACert) > 0 {
			storage["caCert"] = os.CACert
		}
		spec["objectStorage"] = storage
	}
	data, err := json.Marshal(map[string]any{
		"apiVersion": velerov1.SchemeGroupVersion.String(), "kind": "BackupStorageLocation",
		"metadata": map[string]string{"name": bsl.Name, "namespace": bsl.Namespace},
		"spec":     spec,
	})
	if err != nil {
		return nil, fmt.Errorf("render backup storage location %s: %w", bsl.Name, err)
	}
	if _, err := objectstore.ParseBSL(data); err != nil {
		return nil, fmt.Errorf("backup storage location %s: %w", bsl.Name, err)
	}
	return data, nil
}

// usableLocation is loadLocation for the controllers, once the location
// was found Available: a location the datamover cannot use (another
// provider, a config key it does not understand, a caCert without a
// certificate) fails the operation; missing credentials are waited for.
func usableLocation(ctx context.Context, r client.Reader, bsl *velerov1.BackupStorageLocation, poll time.Duration) (*location, error) {
	loc, err := loadLocation(ctx, r, bsl)
	if err != nil && !isFatal(err) {
		return nil, waitFor("BackupStorageLocationUnavailable", poll, "waiting: %v", err)
	}
	return loc, err
}

// LocationConfig reads a BackupStorageLocation of the cluster, whatever
// its phase, and its credentials secret as the controllers do, and returns
// its object store settings with the credentials in memory.
func LocationConfig(ctx context.Context, r client.Reader, namespace, name string) (objectstore.Config, error) {
	bsl := &velerov1.BackupStorageLocation{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, bsl); err != nil {
		return objectstore.Config{}, fmt.Errorf("backup storage location %s/%s: %w", namespace, name, err)
	}
	loc, err := loadLocation(ctx, r, bsl)
	if err != nil {
		return objectstore.Config{}, err
	}
	return loc.config()
}

// loadLocation reads the location's credentials secret. A location the
// datamover cannot use is a fatal error.
func loadLocation(ctx context.Context, r client.Reader, bsl *velerov1.BackupStorageLocation) (*location, error) {
	manifest, err := bslManifest(bsl)
	if err != nil {
		return nil, fatal("%w", err)
	}
	name, key := defaultCredentialsSecret, defaultCredentialsKey
	if c := bsl.Spec.Credential; c != nil {
		name, key = c.Name, c.Key
	}
	secret := &corev1.Secret{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: bsl.Namespace, Name: name}, secret); err != nil {
		return nil, fmt.Errorf("credentials of backup storage location %s: %w", bsl.Name, err)
	}
	creds, ok := secret.Data[key]
	if !ok {
		return nil, fmt.Errorf("credentials of backup storage location %s: secret %s has no key %q", bsl.Name, name, key)
	}
	tokenFile, err := objectstore.WebIdentityTokenFile(creds, bsl.Spec.Config["profile"])
	if err == nil {
		err = checkTokenFile(tokenFile)
	}
	if err != nil {
		return nil, fatal("backup storage location %s, secret %s key %q: %w", bsl.Name, name, key, err)
	}
	return &location{bsl: bsl, manifest: manifest, credentials: creds, secret: secretKey{name: name, key: key},
		tokenFile: tokenFile}, nil
}

// checkTokenFile refuses a web identity token path the pods cannot be
// given: the token's directory is mounted over whatever the image has
// there, so it must be a directory of its own, apart from the pods'
// other volumes.
func checkTokenFile(file string) error {
	if file == "" {
		return nil
	}
	dir := path.Dir(file)
	if !path.IsAbs(file) || path.Clean(file) != file || dir == "/" {
		return fmt.Errorf("web_identity_token_file %q is not a file in a directory of its own (an absolute, clean path below /)", file)
	}
	for _, taken := range []string{"/var/lib/datamover", "/var/run/datamover", "/dev", "/proc", "/sys", "/etc", "/usr", "/bin", "/tmp"} {
		if dir == taken || strings.HasPrefix(dir+"/", taken+"/") || strings.HasPrefix(taken+"/", dir+"/") {
			return fmt.Errorf("web_identity_token_file %q: its directory would be mounted over %s in the datamover's pods", file, taken)
		}
	}
	return nil
}

// config is the location's object store settings, credentials in memory.
func (l *location) config() (objectstore.Config, error) {
	cfg, err := objectstore.ParseBSL(l.manifest)
	if err != nil {
		return objectstore.Config{}, fmt.Errorf("backup storage location %s: %w", l.bsl.Name, err)
	}
	cfg.CredentialsData = l.credentials
	return cfg, nil
}

// open returns a repository on the location for the controller's own reads
// (planning, checking a chain). The credentials stay in memory: the
// controller writes no file (its root file system is read-only).
func (l *location) open() (*backup.Repository, error) {
	cfg, err := l.config()
	if err != nil {
		return nil, err
	}
	repo, err := backup.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("backup storage location %s: %w", l.bsl.Name, err)
	}
	return repo, nil
}
