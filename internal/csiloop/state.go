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

package csiloop

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"golang.org/x/sys/unix"
)

// The state directory is all the driver knows, so that a restarted driver
// (a new pod) carries on where the last one stopped:
//
//	volumes/<id>.img          the volume: a sparse file, its size the volume's
//	volumes/<id>.json         the volume's record; the volume exists once it does
//	staged/<node>/<id>.json   the loop device the volume is staged on, on node
//	lock                      what every node's driver locks while it changes state
//
// The drivers of all nodes may share the directory, nodes of one machine
// as the test cluster's are: they see the same volumes, each stages them
// on loop devices of its own, and a volume is grown for all of them at
// once. A record is written to a temporary file and renamed over, so a
// crash leaves the old record or the new, never half of one.

// volumeRecord is what CreateVolume keeps besides the file.
type volumeRecord struct {
	// Name is the CreateVolume name the volume was made for.
	Name string `json:"name"`
	// AccessType is "block", the only kind served.
	AccessType string `json:"accessType"`
}

// stageRecord is what NodeStageVolume keeps: which loop device is the
// volume's on this node.
type stageRecord struct {
	// Device is the loop device, e.g. /dev/loop3.
	Device string `json:"device"`
	// StagingTargetPath is the path kubelet staged the volume at.
	StagingTargetPath string `json:"stagingTargetPath"`
	// ReadOnly is set when the device was attached read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
}

const accessTypeBlock = "block"

// maxIDLength keeps <id>.json well within a file name's 255 bytes.
const maxIDLength = 128

// safeID is what a volume ID may look like: a file name of its own, never
// a path.
var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// volumeID derives the ID of a volume from its CreateVolume name, so that
// a repeated CreateVolume finds the volume without an index: the name
// itself when it is a safe file name (external-provisioner's pvc-<uid>),
// else a digest of it.
func volumeID(name string) string {
	if len(name) <= maxIDLength && safeID.MatchString(name) {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// validID reports whether id can name a volume of ours; any other ID names
// no volume.
func validID(id string) bool {
	return len(id) <= maxIDLength && safeID.MatchString(id)
}

// state is the state directory, as node sees it.
type state struct {
	dir, node string
}

func newState(dir, node string) (*state, error) {
	if !validID(node) {
		return nil, fmt.Errorf("node ID %q cannot name a directory", node)
	}
	for _, sub := range []string{"volumes", filepath.Join("staged", node)} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return &state{dir: dir, node: node}, nil
}

// lock takes the directory's lock, waiting for the driver of another node
// that holds it, and returns its release.
func (s *state) lock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the state directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the state directory: %w", err)
	}
	return func() { f.Close() }, nil
}

func (s *state) backingFile(id string) string {
	return filepath.Join(s.dir, "volumes", id+".img")
}

func (s *state) volumeRecordPath(id string) string {
	return filepath.Join(s.dir, "volumes", id+".json")
}

func (s *state) stageRecordPath(id string) string {
	return filepath.Join(s.dir, "staged", s.node, id+".json")
}

// volume returns the record of volume id, or nil when there is no such
// volume.
func (s *state) volume(id string) (*volumeRecord, error) {
	if !validID(id) {
		return nil, nil
	}
	rec := &volumeRecord{}
	if ok, err := readRecord(s.volumeRecordPath(id), rec); !ok || err != nil {
		return nil, err
	}
	return rec, nil
}

// size is the size of volume id's file.
func (s *state) size(id string) (int64, error) {
	fi, err := os.Stat(s.backingFile(id))
	if err != nil {
		return 0, fmt.Errorf("volume %s: %w", id, err)
	}
	return fi.Size(), nil
}

// create makes volume id: its sparse file of size bytes, then its record.
// A file left without a record by a crash is no volume and is reused.
func (s *state) create(id string, rec *volumeRecord, size int64) error {
	file := s.backingFile(id)
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	// From zero: a leftover's data must not show through.
	if err := f.Truncate(0); err != nil {
		f.Close()
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create volume %s: %w", id, err)
	}
	return writeRecord(s.volumeRecordPath(id), rec)
}

// grow makes volume id's file size bytes long, if it is shorter.
func (s *state) grow(id string, size int64) error {
	current, err := s.size(id)
	if err != nil {
		return err
	}
	if current >= size {
		return nil
	}
	if err := os.Truncate(s.backingFile(id), size); err != nil {
		return fmt.Errorf("grow volume %s: %w", id, err)
	}
	return nil
}

// remove deletes volume id: the record first, so that a crash leaves at
// most a file that no volume names; then the file and what every node
// recorded of staging it.
func (s *state) remove(id string) error {
	if err := os.Remove(s.volumeRecordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if err := os.Remove(s.backingFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	records, err := filepath.Glob(filepath.Join(s.dir, "staged", "*", id+".json"))
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	for _, rec := range records {
		if err := os.Remove(rec); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	return nil
}

// staged returns where volume id is staged, or nil when it is not.
func (s *state) staged(id string) (*stageRecord, error) {
	rec := &stageRecord{}
	if ok, err := readRecord(s.stageRecordPath(id), rec); !ok || err != nil {
		return nil, err
	}
	return rec, nil
}

func (s *state) setStaged(id string, rec *stageRecord) error {
	return writeRecord(s.stageRecordPath(id), rec)
}

func (s *state) clearStaged(id string) error {
	if err := os.Remove(s.stageRecordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("volume %s: %w", id, err)
	}
	return nil
}

// stagedElsewhere returns the records of the other nodes that staged
// volume id.
func (s *state) stagedElsewhere(id string) ([]*stageRecord, error) {
	nodes, err := os.ReadDir(filepath.Join(s.dir, "staged"))
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", id, err)
	}
	var recs []*stageRecord
	for _, node := range nodes {
		if !node.IsDir() || node.Name() == s.node {
			continue
		}
		rec := &stageRecord{}
		ok, err := readRecord(filepath.Join(s.dir, "staged", node.Name(), id+".json"), rec)
		if err != nil {
			return nil, err
		}
		if ok {
			recs = append(recs, rec)
		}
	}
	return recs, nil
}

// readRecord reads a JSON record; false when there is none.
func readRecord(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return true, nil
}

// writeRecord replaces a JSON record whole.
func writeRecord(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
