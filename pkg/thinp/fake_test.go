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

package thinp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// fakeDomain is a domain with one disk "vda" whose qcow2 image sits on a
// block device, and a guest that writes sequentially into it, behaving
// as QEMU and libvirt do: a threshold fires once when crossed, a write
// past the end of the device pauses the domain with ENOSPC.
type fakeDomain struct {
	mu         sync.Mutex
	xml        string
	usage      thinp.Usage
	thresholds map[string]uint64
	paused     bool
	otherError bool
	events     chan thinp.Event
	// dropEvents loses every event, as a slow receiver or a reconnect
	// would.
	dropEvents bool
	resumes    int
	// usageErr fails Usage.
	usageErr error
	// lagAfterExtend is how many Usage calls return the old device size
	// after an extension.
	lagAfterExtend int
	lag            int
	lagged         int64
	setCalls       []string
	// extendErr fails the extender; sizes records what it was asked.
	extendErr error
	sizes     []int64
}

const fakeXML = `<domain type='kvm'><name>guest</name><devices>
  <disk type='block' device='disk'>
    <driver name='qemu' type='qcow2'/>
    <source dev='/dev/loop7' index='2'/>
    <backingStore type='file' index='1'>
      <format type='raw'/>
      <source file='/images/base.raw'/>
      <backingStore/>
    </backingStore>
    <target dev='vda' bus='virtio'/>
    <alias name='virtio-disk0'/>
  </disk></devices></domain>`

func newFakeDomain(physical, capacity int64) *fakeDomain {
	return &fakeDomain{
		xml:        fakeXML,
		usage:      thinp.Usage{Physical: physical, Capacity: capacity},
		thresholds: map[string]uint64{},
		events:     make(chan thinp.Event, 16),
	}
}

func (f *fakeDomain) Name() string         { return "guest" }
func (f *fakeDomain) XML() (string, error) { return f.xml, nil }

func (f *fakeDomain) Usage(node thinp.Node) (thinp.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if node.Name != "vda[2]" {
		return thinp.Usage{}, fmt.Errorf("no node %s", node.Name)
	}
	if f.usageErr != nil {
		return thinp.Usage{}, f.usageErr
	}
	u := f.usage
	if f.lag > 0 {
		f.lag--
		u.Physical = f.lagged
	}
	return u, nil
}

func (f *fakeDomain) SetThreshold(node string, threshold uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setCalls = append(f.setCalls, fmt.Sprintf("%s=%d", node, threshold))
	if threshold == 0 {
		delete(f.thresholds, node)
	} else {
		f.thresholds[node] = threshold
	}
	return nil
}

func (f *fakeDomain) PausedOnIOError() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.paused, nil
}

func (f *fakeDomain) DiskErrors() (map[string]thinp.DiskError, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := map[string]thinp.DiskError{}
	if f.paused {
		errs["vda"] = thinp.DiskErrorNoSpace
	}
	if f.otherError {
		errs["vdb"] = thinp.DiskErrorOther
	}
	return errs, nil
}

func (f *fakeDomain) Resume() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.paused {
		return errors.New("domain is not paused")
	}
	f.paused = false
	f.resumes++
	return nil
}

func (f *fakeDomain) Events() <-chan thinp.Event { return f.events }

func (f *fakeDomain) send(ev thinp.Event) {
	if f.dropEvents {
		return
	}
	select {
	case f.events <- ev:
	default:
	}
}

// write makes the guest write n more bytes at the end of its allocation.
// It returns false when the domain paused on ENOSPC (or was paused).
func (f *fakeDomain) write(n int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused {
		return false
	}
	next := f.usage.Allocation + n
	if next > f.usage.Physical {
		f.usage.Allocation = f.usage.Physical
		f.paused = true
		f.send(thinp.Event{Kind: thinp.EventIOError, Path: "/dev/loop7", Alias: "virtio-disk0", Reason: thinp.ReasonNoSpace, Paused: true})
		return false
	}
	for node, t := range f.thresholds {
		if f.usage.Allocation <= int64(t) && next > int64(t) {
			delete(f.thresholds, node)
			f.send(thinp.Event{Kind: thinp.EventThreshold, Dev: node, Path: "/dev/loop7"})
		}
	}
	f.usage.Allocation = next
	return true
}

func (f *fakeDomain) snapshot() (thinp.Usage, map[string]uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	th := map[string]uint64{}
	for k, v := range f.thresholds {
		th[k] = v
	}
	return f.usage, th, f.paused
}

func (f *fakeDomain) physical() int64 {
	u, _, _ := f.snapshot()
	return u.Physical
}

// extender grows the fake device, or fails with extendErr.
func (f *fakeDomain) extender() thinp.Extender {
	return thinp.ExtenderFunc(func(ctx context.Context, size int64) (int64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.extendErr != nil {
			return 0, f.extendErr
		}
		f.sizes = append(f.sizes, size)
		if size > f.usage.Physical {
			f.lagged, f.lag = f.usage.Physical, f.lagAfterExtend
			f.usage.Physical = size
		}
		return f.usage.Physical, nil
	})
}

func (f *fakeDomain) set(change func(f *fakeDomain)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *fakeDomain) extensions() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.sizes...)
}
