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
