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

// Package libnbd stands in for libnbd's Go bindings when KubeVirt v1.8.3 is
// built and tested here: the module proxy does not serve the version
// KubeVirt requires, and Debian 12's libnbd 1.14 lacks the 64-bit block
// status API KubeVirt's NBD client (pkg/virt-launcher/virtwrap/storage)
// calls. It declares only what that client uses, with the bindings'
// signatures, and every call fails: the packages that import the client
// compile and their tests run, but nothing here can read an NBD export.
// hack/kubevirt.sh never builds a binary with it (virt-launcher is skipped),
// so it never reaches an image.
package libnbd

import "errors"

// Meta contexts and the extent flags of each, as in libnbd.
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"

	STATE_HOLE  = uint32(1)
	STATE_ZERO  = uint32(2)
	STATE_DIRTY = uint32(1)
)

var errStub = errors.New("libnbd: not available, this build uses the kubevirt-qcow2 API stub (hack/stubs/libnbd)")

// Libnbd is a handle; the stub never makes one.
type Libnbd struct{}

// LibnbdExtent is one extent of a block status reply.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// ExtentCallback64 receives the extents of a block status reply.
type ExtentCallback64 func(metacontext string, offset uint64, e []LibnbdExtent, error *int) int

// BlockStatus64Optargs are BlockStatus64's optional arguments.
type BlockStatus64Optargs struct{}

// PreadOptargs are Pread's optional arguments.
type PreadOptargs struct{}

// LibnbdError is the bindings' error type.
type LibnbdError struct{ Op, Errmsg string }

func (e *LibnbdError) Error() string { return e.Op + ": " + e.Errmsg }

// Create fails: there is no libnbd.
func Create() (*Libnbd, error) { return nil, errStub }

func (h *Libnbd) Close() *LibnbdError { return nil }

func (h *Libnbd) AddMetaContext(string) error { return errStub }

func (h *Libnbd) CanMetaContext(string) (bool, error) { return false, errStub }

func (h *Libnbd) GetSize() (uint64, error) { return 0, errStub }

func (h *Libnbd) SetExportName(string) error { return errStub }

func (h *Libnbd) ConnectUnix(string) error { return errStub }

func (h *Libnbd) BlockStatus64(uint64, uint64, ExtentCallback64, *BlockStatus64Optargs) error {
	return errStub
}

func (h *Libnbd) Pread([]byte, uint64, *PreadOptargs) error { return errStub }
