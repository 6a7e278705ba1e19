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

package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/retry"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// ErrUnchanged is returned by an update function to end the update
// without a write.
var ErrUnchanged = errors.New("document unchanged")

// ErrTooNew is returned for a document written by a newer schema.
var ErrTooNew = errors.New("document written by a newer schema version")

// maxDocumentSize bounds what is read as a document.
const maxDocumentSize = 64 << 20

// Catalog reads and writes the documents in a store opened at the
// datamover's root (see Root): the documents' paths are its keys. Every
// write of a document that already exists is conditional on the ETag it
// was read with, every creation on the key being free (If-None-Match: *): a
// writer that loses re-reads, reapplies its change and tries again, so
// concurrent writers never lose each other's changes.
type Catalog struct {
	Store objectstore.Store
	// Now stamps documents; nil means time.Now.
	Now func() time.Time
	// MaxAttempts bounds the retries of one update; zero means 32.
	MaxAttempts int
}

// New returns a Catalog on store.
func New(store objectstore.Store) *Catalog { return &Catalog{Store: store} }

func (c *Catalog) now() time.Time {
	if c.Now != nil {
		return c.Now().UTC()
	}
	return time.Now().UTC()
}

type versioned interface {
	version() int
	setVersion(int)
}

func (x *VMIndex) version() int              { return x.SchemaVersion }
func (x *VMIndex) setVersion(v int)          { x.SchemaVersion = v }
func (m *BackupManifest) version() int       { return m.SchemaVersion }
func (m *BackupManifest) setVersion(v int)   { m.SchemaVersion = v }
func (m *VMBackupManifest) version() int     { return m.SchemaVersion }
func (m *VMBackupManifest) setVersion(v int) { m.SchemaVersion = v }

// readAttempts bounds the reads of one document that meet a replaced or
// torn object.
const readAttempts = 16

// backoff paces the attempts of a read or write that met another writer:
// pauses from 5 ms doubling to 200 ms, each stretched at random by up to as
// much again so that racing writers part.
func backoff(attempts int) wait.Backoff {
	return wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 1, Cap: 200 * time.Millisecond, Steps: attempts}
}

// read decodes the document at key into doc and returns its ETag; found is
// false when there is none. A document replaced while it is read, or whose
// bytes are not the object the store described (fewer than its size, not
// the SHA-256 written with it, or not the store's checksum), is read again;
// a document is never decoded from a torn read.
func (c *Catalog) read(ctx context.Context, key string, doc versioned) (etag string, found bool, err error) {
	err = retry.OnError(ctx, backoff(readAttempts), replacedWhileRead, func() error {
		etag, found, err = c.readOnce(ctx, key, doc)
		return err
	})
	if err != nil {
		return "", false, err
	}
	return etag, found, nil
}

func replacedWhileRead(err error) bool {
	return errors.Is(err, objectstore.ErrPreconditionFailed) || errors.Is(err, objectstore.ErrTornRead)
}

func (c *Catalog) readOnce(ctx context.Context, key string, doc versioned) (etag string, found bool, err error) {
	rc, info, err := c.Store.Get(ctx, key, 0, 0)
	if errors.Is(err, objectstore.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", key, err)
	}
	defer rc.Close()
	if info.Size > maxDocumentSize {
		return "", false, fmt.Errorf("read %s: %d bytes, larger than %d", key, info.Size, maxDocumentSize)
	}
	data, err := io.ReadAll(io.LimitReader(rc, maxDocumentSize+1))
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", key, err)
	}
	if err := objectstore.Verify(info, data); err != nil {
		return "", false, fmt.Errorf("read %s: %w", key, err)
	}
	// A retried read must not merge into what an earlier one decoded.
	reflect.ValueOf(doc).Elem().SetZero()
	if err := json.Unmarshal(data, doc); err != nil {
		return "", false, fmt.Errorf("decode %s: %w", key, err)
	}
	if doc.version() > SchemaVersion {
		return "", false, fmt.Errorf("%s has schema version %d, this release reads up to %d: %w", key, doc.version(), SchemaVersion, ErrTooNew)
	}
	return info.ETag, true, nil
}

// errLostRace marks a conditional write that another writer's change beat.
var errLostRace = errors.New("lost to a concurrent writer")

func lostRace(err error) bool { return errors.Is(err, errLostRace) }

// update applies fn to the document at key (a fresh zero document when
// there is none) and writes the result conditionally, retrying on
// conflicts. newDoc returns a zero document.
func update[T any, P interface {
	*T
	versioned
}](ctx context.Context, c *Catalog, key string, fn func(doc P, found bool) error) (P, error) {
	attempts := c.MaxAttempts
	if attempts <= 0 {
		attempts = 32
	}
	var doc P
	err := retry.OnError(ctx, backoff(attempts), lostRace, func() error {
		doc = P(new(T))
		etag, found, err := c.read(ctx, key, doc)
		if err != nil {
			return err
		}
		if err := fn(doc, found); err != nil {
			return err
		}
		doc.setVersion(SchemaVersion)
		data, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("encode %s: %w", key, err)
		}
		cond := objectstore.Condition{IfMatch: etag}
		if !found {
			cond = objectstore.Condition{IfNoneMatch: true}
		}
		_, err = c.Store.Put(ctx, key, bytes.NewReader(data), int64(len(data)),
			objectstore.PutOptions{Condition: cond, ContentType: "application/json", SHA256: objectstore.SHA256(data)})
		// A lost race shows as 412, or as 404 when the object we matched
		// against was deleted meanwhile.
		if errors.Is(err, objectstore.ErrPreconditionFailed) || errors.Is(err, objectstore.ErrNotFound) {
			return fmt.Errorf("write %s: %w: %w", key, errLostRace, err)
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrUnchanged) {
		return nil, err
	}
	return doc, nil
}

// VMIndex reads a VM's index; a VM with no index gets an empty one.
func (c *Catalog) VMIndex(ctx context.Context, vm VM) (*VMIndex, error) {
	idx := &VMIndex{}
	_, found, err := c.read(ctx, VMIndexPath(vm), idx)
	if err != nil {
		return nil, err
	}
	if !found {
		return &VMIndex{SchemaVersion: SchemaVersion, VMName: vm.Name, Namespace: vm.Namespace}, nil
	}
	return idx, nil
}

// UpdateVMIndex applies fn to a VM's index under optimistic concurrency.
// fn may run several times; it must derive its change from the index it is
// given.
func (c *Catalog) UpdateVMIndex(ctx context.Context, vm VM, fn func(*VMIndex) error) (*VMIndex, error) {
	return update(ctx, c, VMIndexPath(vm), func(idx *VMIndex, found bool) error {
		if !found {
			idx.VMName, idx.Namespace = vm.Name, vm.Namespace
		}
		if err := fn(idx); err != nil {
			return err
		}
		idx.LastUpdated = c.now()
		return nil
	})
}

// BackupManifest reads manifests/<backup>/index.json; found is false when
// there is none.
func (c *Catalog) BackupManifest(ctx context.Context, backup string) (*BackupManifest, bool, error) {
	m := &BackupManifest{}
	_, found, err := c.read(ctx, BackupIndexPath(backup), m)
	return m, found, err
}

// AddVMToBackup records vm (at checkpoint, with its manifest at
// manifestPath) in the backup's index, replacing an earlier record of the
// same VM.
func (c *Catalog) AddVMToBackup(ctx context.Context, backup string, entry BackupVM) (*BackupManifest, error) {
	return update(ctx, c, BackupIndexPath(backup), func(m *BackupManifest, found bool) error {
		if !found {
			m.BackupName = backup
			m.Timestamp = c.now()
		}
		for i, v := range m.VMs {
			if v.Namespace == entry.Namespace && v.Name == entry.Name {
				if v == entry {
					return ErrUnchanged
				}
				m.VMs[i] = entry
				return nil
			}
		}
		m.VMs = append(m.VMs, entry)
		return nil
	})
}

// VMManifest reads a VM's manifest of a backup at rel (relative to the root).
func (c *Catalog) VMManifest(ctx context.Context, rel string) (*VMBackupManifest, error) {
	m := &VMBackupManifest{}
	_, found, err := c.read(ctx, rel, m)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("manifest %s: %w", rel, objectstore.ErrNotFound)
	}
	return m, nil
}

// PutVMManifest writes a VM's manifest of a backup and returns its path
// relative to the root. A manifest of the same VM is replaced (a retried
// upload); one of another VM whose name collides is left alone and this
// one takes a disambiguated name.
func (c *Catalog) PutVMManifest(ctx context.Context, m VMBackupManifest) (string, error) {
	vm := VM{Namespace: m.Namespace, Name: m.Name}
	for _, rel := range []string{VMManifestPath(m.BackupName, vm), DisambiguatedVMManifestPath(m.BackupName, vm)} {
		collided := false
		_, err := update(ctx, c, rel, func(doc *VMBackupManifest, found bool) error {
			if found && (doc.Namespace != m.Namespace || doc.Name != m.Name) {
				collided = true
				return ErrUnchanged
			}
			*doc = m
			return nil
		})
		if err != nil {
			return "", err
		}
		if !collided {
			return rel, nil
		}
	}
	return "", fmt.Errorf("manifest of %s in backup %s: both names taken by other VMs", vm, m.BackupName)
}

// VMs lists the VMs that have an index.
func (c *Catalog) VMs(ctx context.Context) ([]VM, error) {
	objs, err := c.Store.List(ctx, "checkpoints/")
	if err != nil {
		return nil, fmt.Errorf("list VM indexes: %w", err)
	}
	var out []VM
	for _, o := range objs {
		if vm, ok := ParseVMIndexPath(o.Key); ok {
			out = append(out, vm)
		}
	}
	return out, nil
}

// Backups lists the backups that have an index.
func (c *Catalog) Backups(ctx context.Context) ([]string, error) {
	objs, err := c.Store.List(ctx, "manifests/")
	if err != nil {
		return nil, fmt.Errorf("list backups: %w", err)
	}
	var out []string
	for _, o := range objs {
		if b, ok := ParseBackupIndexPath(o.Key); ok {
			out = append(out, b)
		}
	}
	return out, nil
}
