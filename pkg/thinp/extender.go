package thinp

import "context"

// Extender grows the block device under one disk.
type Extender interface {
	// Extend grows the device to at least size bytes (never shrinks it)
	// and returns the size it has afterwards. Extending to a size the
	// device already has succeeds without changing anything.
	Extend(ctx context.Context, size int64) (int64, error)
}

// ExtenderFunc adapts a function to Extender.
type ExtenderFunc func(ctx context.Context, size int64) (int64, error)

// Extend calls f.
func (f ExtenderFunc) Extend(ctx context.Context, size int64) (int64, error) {
	return f(ctx, size)
}
