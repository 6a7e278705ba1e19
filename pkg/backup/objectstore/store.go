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

// Package objectstore holds the object-storage side of backups: a small
// Store interface with conditional writes, its S3 implementation, and the
// configuration of a backup storage location in Velero's shape.
package objectstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/minio/minio-go/v7"
)

// ErrNotFound is returned when an object does not exist.
var ErrNotFound = errors.New("object not found")

// ErrPreconditionFailed is returned when a conditional write lost: the
// object changed (If-Match) or appeared (If-None-Match) since it was read.
var ErrPreconditionFailed = errors.New("precondition failed")

// ErrTornRead is returned when the bytes read from an object are not the
// object the store described with them: fewer than its size, or not
// matching its checksum.
var ErrTornRead = errors.New("torn read")

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key string
	// Size is the whole object's size, also for a read of a range.
	Size         int64
	ETag         string
	LastModified time.Time
	// Checksum is the store's checksum of the whole object, set by Get
	// of the whole object when the store reports one.
	Checksum Checksum
	// SHA256 is the hex SHA-256 its writer recorded with the object
	// (PutOptions.SHA256), set by Get of the whole object when there is
	// one.
	SHA256 string
}

// Checksum is a whole-object checksum as S3 reports it: an algorithm
// (CRC32, CRC32C, CRC64NVME, SHA1 or SHA256) and its base64 value.
type Checksum struct {
	Algorithm string
	Value     string
}

var checksumTypes = map[string]minio.ChecksumType{
	"CRC32":     minio.ChecksumCRC32,
	"CRC32C":    minio.ChecksumCRC32C,
	"CRC64NVME": minio.ChecksumCRC64NVME,
	"SHA1":      minio.ChecksumSHA1,
	"SHA256":    minio.ChecksumSHA256,
}

// ChecksumOf computes data's checksum with algorithm, one of Checksum's.
func ChecksumOf(algorithm string, data []byte) (Checksum, error) {
	t, ok := checksumTypes[algorithm]
	if !ok {
		return Checksum{}, fmt.Errorf("checksum algorithm %q is not one of CRC32, CRC32C, CRC64NVME, SHA1, SHA256", algorithm)
	}
	h := t.Hasher()
	h.Write(data)
	return Checksum{Algorithm: algorithm, Value: base64.StdEncoding.EncodeToString(h.Sum(nil))}, nil
}

// Verify checks that data, read whole from offset 0, is the object info
// describes: its size, the SHA-256 its writer recorded with it if any,
// and the store's checksum when it reported one in an algorithm this
// package knows. A mismatch wraps ErrTornRead.
func Verify(info ObjectInfo, data []byte) error {
	if int64(len(data)) != info.Size {
		return fmt.Errorf("got %d of %d bytes: %w", len(data), info.Size, ErrTornRead)
	}
	if info.SHA256 != "" {
		if got := SHA256(data); got != info.SHA256 {
			return fmt.Errorf("sha256 is %s, its writer recorded %s: %w", got, info.SHA256, ErrTornRead)
		}
	}
	if _, known := checksumTypes[info.Checksum.Algorithm]; !known {
		return nil
	}
	got, _ := ChecksumOf(info.Checksum.Algorithm, data)
	if got != info.Checksum {
		return fmt.Errorf("%s is %s, the store reports %s: %w", got.Algorithm, got.Value, info.Checksum.Value, ErrTornRead)
	}
	return nil
}

// SHA256 is data's hex SHA-256, as PutOptions.SHA256 and
// ObjectInfo.SHA256 carry it.
func SHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Condition makes a write conditional. The zero value writes
// unconditionally.
type Condition struct {
	// IfMatch writes only when the object's current ETag is this one.
	IfMatch string
	// IfNoneMatch writes only when no object exists under the key.
	IfNoneMatch bool
}

// PutOptions tune one write.
type PutOptions struct {
	Condition Condition
	// ContentType is stored with the object; empty means binary.
	ContentType string
	// SHA256, the hex SHA-256 of what is written, is kept with the object
	// (as user metadata, which every S3 store keeps) for Verify: a reader
	// checks the bytes it got against it, whether or not the store keeps
	// a checksum of its own. Empty keeps none.
	SHA256 string
}

// Store is what backups need from an object store. Keys are relative to
// the store's prefix.
type Store interface {
	// Get opens an object for reading length bytes from offset on, or
	// to its end when length is 0.
	Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, ObjectInfo, error)
	// Stat describes an object without reading it.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Put stores size bytes read from r (size -1 when unknown), streaming
	// large objects in parts with bounded memory.
	Put(ctx context.Context, key string, r io.Reader, size int64, opts PutOptions) (ObjectInfo, error)
	// Delete removes an object; a missing object is not an error.
	Delete(ctx context.Context, key string) error
	// List returns every object whose key starts with prefix.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
}
