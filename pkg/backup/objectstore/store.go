// Package objectstore holds the object-storage side of backups: a small
// Store interface with conditional writes, its S3 implementation, and the
// configuration of a backup storage location in Velero's shape.
package objectstore

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned when an object does not exist.
var ErrNotFound = errors.New("object not found")

// ErrPreconditionFailed is returned when a conditional write lost: the
// object changed (If-Match) or appeared (If-None-Match) since it was read.
var ErrPreconditionFailed = errors.New("precondition failed")

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key          string
	Size         int64
	ETag         string
	LastModified time.Time
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
}

// Store is what backups need from an object store. Keys are relative to
// the store's prefix.
type Store interface {
	// Get opens an object for reading from offset on.
	Get(ctx context.Context, key string, offset int64) (io.ReadCloser, ObjectInfo, error)
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
