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

// Package libvirtdomain connects a thinp.Monitor to a domain of a libvirt
// daemon through libvirt's C client library (cgo).
package libvirtdomain

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

// eventBuffer is how many events wait for a slow Monitor before new ones
// are dropped (the Monitor's poll makes up for them).
const eventBuffer = 64

var (
	eventLoopOnce sync.Once
	eventLoopErr  error
)

// StartEventLoop registers libvirt's default event loop and runs it in the
// background for the rest of the process. libvirt delivers domain events
// only through an event loop, and it has one per process, registered before
// the first connection opens. Calling it again does nothing.
func StartEventLoop() error {
	eventLoopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			eventLoopErr = fmt.Errorf("register libvirt event loop: %w", err)
			return
		}
		go func() {
			for {
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					// Only a broken loop fails; do not spin on it.
					time.Sleep(time.Second)
				}
			}
		}()
	})
	return eventLoopErr
}

// Domain is a running libvirt domain as a thinp.Monitor sees it.
type Domain struct {
	conn      *libvirt.Connect
	dom       *libvirt.Domain
	name      string
	events    chan thinp.Event
	callbacks []int
	closeOnce sync.Once
}

var _ thinp.Domain = (*Domain)(nil)

// New watches the domain called name on conn. The event loop must run
// (StartEventLoop before the connection opened). Close releases it.
func New(conn *libvirt.Connect, name string) (*Domain, error) {
	dom, err := conn.LookupDomainByName(name)
	if err != nil {
		return nil, fmt.Errorf("look up domain %s: %w", name, err)
	}
	d := &Domain{conn: conn, dom: dom, name: name, events: make(chan thinp.Event, eventBuffer)}
	id, err := conn.DomainEventBlockThresholdRegister(dom, func(_ *libvirt.Connect, _ *libvirt.Domain, ev *libvirt.DomainEventBlockThreshold) {
		d.send(thinp.Event{Kind: thinp.EventThreshold, Dev: ev.Dev, Path: ev.Path, At: time.Now()})
	})
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("watch block thresholds of domain %s: %w", name, err)
	}
	d.callbacks = append(d.callbacks, id)
	id, err = conn.DomainEventIOErrorReasonRegister(dom, func(_ *libvirt.Connect, _ *libvirt.Domain, ev *libvirt.DomainEventIOErrorReason) {
		d.send(thinp.Event{
			Kind: thinp.EventIOError, Path: ev.SrcPath, Alias: ev.DevAlias, Reason: ev.Reason,
			Paused: ev.Action == libvirt.DOMAIN_EVENT_IO_ERROR_PAUSE, At: time.Now(),
		})
	})
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("watch I/O errors of domain %s: %w", name, err)
	}
	d.callbacks = append(d.callbacks, id)
	return d, nil
}

func (d *Domain) send(ev thinp.Event) {
	select {
	case d.events <- ev:
	default:
	}
}

// Close stops watching the domain's events.
func (d *Domain) Close() error {
	var errs []error
	d.closeOnce.Do(func() {
		for _, id := range d.callbacks {
			if err := d.conn.DomainEventDeregister(id); err != nil {
				errs = append(errs, err)
			}
		}
		if err := d.dom.Free(); err != nil {
			errs = append(errs, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop watching domain %s: %w", d.name, err)
	}
	return nil
}

// Name is the domain's name.
func (d *Domain) Name() string { return d.name }

// XML is the live domain XML.
func (d *Domain) XML() (string, error) {
	x, err := d.dom.GetXMLDesc(0)
	if err != nil {
		return "", fmt.Errorf("read XML of domain %s: %w", d.name, err)
	}
	return x, nil
}

// Usage reads what QEMU reports of a node: through virDomainGetBlockInfo
// for the image the guest writes to, through the domain's block statistics
// with backing chains for an image deeper in the chain.
func (d *Domain) Usage(node thinp.Node) (thinp.Usage, error) {
	if node.Active {
		info, err := d.dom.GetBlockInfo(node.Target, 0)
		if err != nil {
			return thinp.Usage{}, fmt.Errorf("read block info of %s in domain %s: %w", node.Target, d.name, err)
		}
		return thinp.Usage{Allocation: int64(info.Allocation), Physical: int64(info.Physical), Capacity: int64(info.Capacity)}, nil
	}
	stats, err := d.conn.GetAllDomainStats([]*libvirt.Domain{d.dom}, libvirt.DOMAIN_STATS_BLOCK, libvirt.CONNECT_GET_ALL_DOMAINS_STATS_BACKING)
	if err != nil {
		return thinp.Usage{}, fmt.Errorf("read block stats of domain %s: %w", d.name, err)
	}
	for _, s := range stats {
		for _, b := range s.Block {
			if b.Name == node.Target && b.BackingIndexSet && b.BackingIndex == node.Index {
				return thinp.Usage{Allocation: int64(b.Allocation), Physical: int64(b.Physical), Capacity: int64(b.Capacity)}, nil
			}
		}
	}
	return thinp.Usage{}, fmt.Errorf("read block stats of domain %s: no node %s", d.name, node.Name)
}

// SetThreshold arms a node's write threshold; 0 disarms it.
func (d *Domain) SetThreshold(node string, threshold uint64) error {
	if err := d.dom.SetBlockThreshold(node, threshold, 0); err != nil {
		return fmt.Errorf("set block threshold of %s in domain %s to %d: %w", node, d.name, threshold, err)
	}
	return nil
}

// PausedOnIOError reports whether the domain is paused on a disk error.
func (d *Domain) PausedOnIOError() (bool, error) {
	state, reason, err := d.dom.GetState()
	if err != nil {
		return false, fmt.Errorf("read state of domain %s: %w", d.name, err)
	}
	return state == libvirt.DOMAIN_PAUSED && libvirt.DomainPausedReason(reason) == libvirt.DOMAIN_PAUSED_IOERROR, nil
}

// DiskErrors lists the disks with a pending I/O error.
func (d *Domain) DiskErrors() (map[string]thinp.DiskError, error) {
	list, err := d.dom.GetDiskErrors(0)
	if err != nil {
		return nil, fmt.Errorf("read disk errors of domain %s: %w", d.name, err)
	}
	errs := map[string]thinp.DiskError{}
	for _, e := range list {
		switch e.Error {
		case libvirt.DOMAIN_DISK_ERROR_NONE:
		case libvirt.DOMAIN_DISK_ERROR_NO_SPACE:
			errs[e.Disk] = thinp.DiskErrorNoSpace
		default:
			errs[e.Disk] = thinp.DiskErrorOther
		}
	}
	return errs, nil
}

// Resume resumes the domain.
func (d *Domain) Resume() error {
	if err := d.dom.Resume(); err != nil {
		return fmt.Errorf("resume domain %s: %w", d.name, err)
	}
	return nil
}

// Events delivers threshold and io-error events.
func (d *Domain) Events() <-chan thinp.Event { return d.events }
