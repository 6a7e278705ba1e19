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

package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/objectstore"
)

// DefaultGrace is how old a pending checkpoint or an object no document
// names must be before garbage collection removes it: longer than any
// upload takes.
const DefaultGrace = 24 * time.Hour

// GCOptions tune garbage collection.
type GCOptions struct {
	// Grace protects pending checkpoints and unrecorded objects younger
	// than it (uploads in progress). Zero means DefaultGrace; negative
	// means none (only safe when no upload runs).
	Grace time.Duration
	// DryRun reports what would be removed and changes nothing: no
	// index is written, no object deleted.
	DryRun bool
}

func (o GCOptions) grace() time.Duration {
	switch {
	case o.Grace < 0:
		return 0
	case o.Grace == 0:
		return DefaultGrace
	}
	return o.Grace
}

// GCReport lists what garbage collection removed (with DryRun, what it
// would remove).
type GCReport struct {
	// Checkpoints are "<ns>/<vm>/<id>" entries dropped from indexes.
	Checkpoints []string
	// Objects are deleted keys.
	Objects []string
}

func (g *GCReport) merge(o *GCReport) {
	g.Checkpoints = append(g.Checkpoints, o.Checkpoints...)
	g.Objects = append(g.Objects, o.Objects...)
}

// DeleteBackup drops backup's references from every VM index, removes the
// checkpoints and objects no backup needs any more, and deletes the
// backup's manifests. Objects still needed by other backups stay. It is
// idempotent: run it again after a crash.
func (r *Repository) DeleteBackup(ctx context.Context, backup string, opts GCOptions) (*GCReport, error) {
	vms, err := r.Catalog.VMs(ctx)
	if err != nil {
		return nil, fmt.Errorf("delete backup %s: %w", backup, err)
	}
	report := &GCReport{}
	for _, vm := range vms {
		rep, err := r.collectVM(ctx, vm, opts, backup)
		if err != nil {
			return report, fmt.Errorf("delete backup %s: %w", backup, err)
		}
		report.merge(rep)
	}
	// Manifests go last: until they do, a rerun finds the backup again.
	dir := catalog.BackupDir(backup)
	index := catalog.BackupIndexPath(backup)
	if !opts.DryRun {
		if err := r.deletePrefix(ctx, dir, func(o objectstore.ObjectInfo) bool { return o.Key != index }); err != nil {
			return report, fmt.Errorf("delete backup %s: %w", backup, err)
		}
		if err := r.Store.Delete(ctx, index); err != nil {
			return report, fmt.Errorf("delete backup %s: %w", backup, err)
		}
	}
	report.Objects = append(report.Objects, dir)
	return report, nil
}

// Collect removes, for every VM, what no backup needs: complete checkpoints
// no backup references (and that no needed checkpoint has as an ancestor),
// pending checkpoints older than the grace period (crashed uploads), and
// objects no index entry names that are older than the grace period. It
// also deletes manifests of backups whose index is gone.
func (r *Repository) Collect(ctx context.Context, opts GCOptions) (*GCReport, error) {
	vms, err := r.Catalog.VMs(ctx)
	if err != nil {
		return nil, fmt.Errorf("collect garbage: %w", err)
	}
	report := &GCReport{}
	for _, vm := range vms {
		rep, err := r.collectVM(ctx, vm, opts, "")
		if err != nil {
			return report, fmt.Errorf("collect garbage: %w", err)
		}
		report.merge(rep)
	}
	rep, err := r.collectManifests(ctx, opts)
	report.merge(rep)
	if err != nil {
		return report, fmt.Errorf("collect garbage: %w", err)
	}
	return report, nil
}

// collectVM drops removeRef (if any) from vm's checkpoints, then the
// checkpoints nothing needs, then the objects nothing names.
func (r *Repository) collectVM(ctx context.Context, vm catalog.VM, opts GCOptions, removeRef string) (*GCReport, error) {
	now := r.now()
	grace := opts.grace()
	report := &GCReport{}
	var dropped []string
	change := func(idx *catalog.VMIndex) error {
		dropped = dropped[:0]
		changed := false
		if removeRef != "" {
			for i := range idx.Checkpoints {
				changed = idx.Checkpoints[i].RemoveReference(removeRef) || changed
			}
		}
		live := liveCheckpoints(idx, now, grace)
		kept := idx.Checkpoints[:0]
		for _, c := range idx.Checkpoints {
			if live[c.ID] {
				kept = append(kept, c)
			} else {
				dropped = append(dropped, c.ID)
			}
		}
		idx.Checkpoints = kept
		if !changed && len(dropped) == 0 {
			return catalog.ErrUnchanged
		}
		return nil
	}
	var idx *catalog.VMIndex
	var err error
	if opts.DryRun {
		if idx, err = r.Catalog.VMIndex(ctx, vm); err == nil {
			if err = change(idx); errors.Is(err, catalog.ErrUnchanged) {
				err = nil
			}
		}
	} else {
		idx, err = r.Catalog.UpdateVMIndex(ctx, vm, change)
	}
	if err != nil {
		return nil, fmt.Errorf("collect %s: %w", vm, err)
	}
	for _, id := range dropped {
		report.Checkpoints = append(report.Checkpoints, vm.String()+"/"+id)
	}

	// Objects go only after the index stopped naming them: a reader never
	// finds an entry whose objects are gone because of us.
	named := map[string]bool{catalog.VMIndexPath(vm): true}
	pendingDirs := []string{}
	for _, c := range idx.Checkpoints {
		if !c.IsComplete() {
			pendingDirs = append(pendingDirs, catalog.CheckpointDir(vm, c.ID))
			continue
		}
		for _, f := range c.Files {
			named[f.ObjectPath] = true
		}
		for _, p := range []string{c.VMBObjectPath, c.VMBTObjectPath} {
			if p != "" {
				named[p] = true
			}
		}
	}
	droppedDirs := make([]string, len(dropped))
	for i, id := range dropped {
		droppedDirs[i] = catalog.CheckpointDir(vm, id)
	}
	objs, err := r.Store.List(ctx, catalog.VMDir(vm))
	if err != nil {
		return report, fmt.Errorf("collect %s: %w", vm, err)
	}
	for _, o := range objs {
		if named[o.Key] || hasAnyPrefix(o.Key, pendingDirs) {
			continue
		}
		if !hasAnyPrefix(o.Key, droppedDirs) && now.Sub(o.LastModified) < grace {
			continue // maybe an upload that has not begun its entry yet
		}
		if err := r.delete(ctx, o.Key, opts); err != nil {
			return report, fmt.Errorf("collect %s: %w", vm, err)
		}
		report.Objects = append(report.Objects, o.Key)
	}
	return report, nil
}

// liveCheckpoints are the checkpoints a backup references, pending ones
// younger than grace, and every ancestor of those.
func liveCheckpoints(idx *catalog.VMIndex, now time.Time, grace time.Duration) map[string]bool {
	live := map[string]bool{}
	var mark func(id string) //nolint:staticcheck // mark calls itself, so it is declared first
	mark = func(id string) {
		for id != "" && !live[id] {
			c := idx.Checkpoint(id)
			if c == nil {
				return
			}
			live[id] = true
			id = c.Parent
		}
	}
	for _, c := range idx.Checkpoints {
		switch {
		case !c.IsComplete() && now.Sub(c.Timestamp) < grace:
			mark(c.ID)
		case c.IsComplete() && len(c.ReferencedBy) > 0:
			mark(c.ID)
		}
	}
	return live
}

// collectManifests deletes files under manifests/<backup>/ of backups that
// have no index.json any more (a deletion or an upload that crashed), once
// they are older than the grace period.
func (r *Repository) collectManifests(ctx context.Context, opts GCOptions) (*GCReport, error) {
	report := &GCReport{}
	objs, err := r.Store.List(ctx, "manifests/")
	if err != nil {
		return report, err
	}
	withIndex := map[string]bool{}
	for _, o := range objs {
		if b, ok := catalog.ParseBackupIndexPath(o.Key); ok {
			withIndex[b] = true
		}
	}
	now := r.now()
	for _, o := range objs {
		parts := strings.Split(o.Key, "/")
		if len(parts) < 3 || withIndex[parts[1]] || now.Sub(o.LastModified) < opts.grace() {
			continue
		}
		if err := r.delete(ctx, o.Key, opts); err != nil {
			return report, err
		}
		report.Objects = append(report.Objects, o.Key)
	}
	return report, nil
}

// delete deletes key, unless this is a dry run.
func (r *Repository) delete(ctx context.Context, key string, opts GCOptions) error {
	if opts.DryRun {
		return nil
	}
	return r.Store.Delete(ctx, key)
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// deletePrefix deletes every object under prefix that filter (if set)
// accepts.
func (r *Repository) deletePrefix(ctx context.Context, prefix string, filter func(objectstore.ObjectInfo) bool) error {
	objs, err := r.Store.List(ctx, prefix)
	if err != nil {
		return err
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
	for _, o := range objs {
		if filter != nil && !filter(o) {
			continue
		}
		if err := r.Store.Delete(ctx, o.Key); err != nil {
			return err
		}
	}
	return nil
}
