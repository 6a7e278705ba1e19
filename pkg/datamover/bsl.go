package datamover

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
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
}

// bslManifest renders what a pod needs of a location: provider, bucket,
// prefix and config, no status or metadata.
func bslManifest(bsl *velerov1.BackupStorageLocation) ([]byte, error) {
	spec := map[string]any{"provider": bsl.Spec.Provider, "config": bsl.Spec.Config}
	if os := bsl.Spec.ObjectStorage; os != nil {
		spec["objectStorage"] = map[string]string{"bucket": os.Bucket, "prefix": os.Prefix}
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

// loadLocation reads the location's credentials secret. The location must
// have been found Available.
func loadLocation(ctx context.Context, r client.Reader, bsl *velerov1.BackupStorageLocation) (*location, error) {
	manifest, err := bslManifest(bsl)
	if err != nil {
		return nil, err
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
	return &location{bsl: bsl, manifest: manifest, credentials: creds}, nil
}

// open returns a repository on the location for the controller's own reads
// (planning, checking a chain). The S3 client reads the credentials when it
// is made, so they only pass through a private temporary file.
func (l *location) open() (*backup.Repository, error) {
	dir, err := os.MkdirTemp("", "datamover-bsl-")
	if err != nil {
		return nil, fmt.Errorf("backup storage location %s: %w", l.bsl.Name, err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "credentials")
	if err := os.WriteFile(file, l.credentials, 0o600); err != nil {
		return nil, fmt.Errorf("backup storage location %s: %w", l.bsl.Name, err)
	}
	return mover.Repository(l.manifest, file)
}
