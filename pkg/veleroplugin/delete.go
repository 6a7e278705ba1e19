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

package veleroplugin

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// deleteTimeout bounds one backup's removal from a location.
const deleteTimeout = time.Hour

// RepositoryOpener opens the repository of the backup storage location
// namespace/name.
type RepositoryOpener func(ctx context.Context, c client.Reader, namespace, name string) (*backup.Repository, error)

// OpenLocation reads the location and its credentials as the controllers
// do (datamover.LocationConfig) and opens its repository.
func OpenLocation(ctx context.Context, c client.Reader, namespace, name string) (*backup.Repository, error) {
	cfg, err := datamover.LocationConfig(ctx, c, namespace, name)
	if err != nil {
		return nil, err
	}
	return backup.Open(cfg)
}

// DeleteAction is the DeleteItemAction on DataUploads. Velero runs it for
// every DataUpload in the tarball of a backup it deletes (BackupAction made
// the backup's DataUploads post-operation items, so they are there); for
// one of the "kubevirt" data mover it removes the backup from the
// catalog of the upload's location (Repository.DeleteBackup): every VM's
// checkpoints stop naming the backup, the checkpoints and objects no other
// backup needs are deleted, then the backup's manifests. Backups that
// earlier releases wrote under the location's prefix are removed there too.
// A backup is removed once per Velero deletion however many VMs it holds;
// DeleteBackup is idempotent, so a deletion Velero repeats does no harm.
//
// Velero logs the action's error and deletes the backup anyway: what it
// failed to remove, `qcow2-backup delete` removes later.
type DeleteAction struct {
	client client.Reader
	log    logrus.FieldLogger
	open   RepositoryOpener

	mu      sync.Mutex
	deleted map[string]bool
}

// NewDeleteAction returns the action, which reads locations and their
// credentials through c.
func NewDeleteAction(c client.Reader, log logrus.FieldLogger) *DeleteAction {
	return &DeleteAction{client: c, log: log, open: OpenLocation, deleted: map[string]bool{}}
}

// WithOpener replaces how the action opens a location's repository.
func (a *DeleteAction) WithOpener(open RepositoryOpener) *DeleteAction {
	a.open = open
	return a
}

// AppliesTo selects DataUploads.
func (a *DeleteAction) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{dataUploads}}, nil
}

// Execute removes the DataUpload's backup from its location.
func (a *DeleteAction) Execute(in *velero.DeleteItemActionExecuteInput) error {
	du := &velerov2.DataUpload{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(in.Item.UnstructuredContent(), du); err != nil {
		return fmt.Errorf("read DataUpload: %w", err)
	}
	if du.Spec.DataMover != datamover.DataMover {
		return nil
	}
	name, vm, err := datamover.UploadTarget(du)
	if err != nil {
		return fmt.Errorf("DataUpload %s/%s: %w", du.Namespace, du.Name, err)
	}
	namespace, location := in.Backup.Namespace, du.Spec.BackupStorageLocation
	if location == "" {
		location = in.Backup.Spec.StorageLocation
	}
	if namespace == "" {
		namespace = du.Namespace
	}
	log := a.log.WithFields(logrus.Fields{"backup": in.Backup.Namespace + "/" + in.Backup.Name,
		"location": location, "dataupload": du.Name, "vm": vm.String()})
	key := string(in.Backup.UID) + "/" + namespace + "/" + location + "/" + name

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deleted[key] {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	repo, err := a.open(ctx, a.client, namespace, location)
	if err != nil {
		return fmt.Errorf("delete backup %s from location %s: %w", name, location, err)
	}
	rep, err := repo.DeleteBackup(ctx, name, backup.GCOptions{})
	if err != nil {
		return fmt.Errorf("delete backup %s from location %s: %w", name, location, err)
	}
	if repo.Legacy != nil {
		old, err := backup.NewRepository(repo.Legacy).DeleteBackup(ctx, name, backup.GCOptions{})
		if err != nil {
			return fmt.Errorf("delete backup %s from location %s (earlier layout): %w", name, location, err)
		}
		rep.Checkpoints = append(rep.Checkpoints, old.Checkpoints...)
		rep.Objects = append(rep.Objects, old.Objects...)
	}
	a.deleted[key] = true
	log.Infof("backup %s removed from the catalog: %d checkpoints and %d objects no other backup needs deleted",
		name, len(rep.Checkpoints), len(rep.Objects))
	return nil
}
