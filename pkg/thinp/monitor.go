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

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// EventKind tells the events a Monitor acts on apart.
type EventKind int

const (
	// EventThreshold means a block write threshold was crossed (libvirt's
	// block-threshold event; one-shot).
	EventThreshold EventKind = iota
	// EventIOError means a disk reported an I/O error (libvirt's io-error
	// event with a reason).
	EventIOError
)

// ReasonNoSpace is the io-error reason of a write past the end of a device.
const ReasonNoSpace = "enospc"

// Event is a libvirt domain event as a Monitor needs it.
type Event struct {
	Kind EventKind
	// Dev is the node a threshold event names ("vda[2]" or "vda").
	Dev string
	// Path is the image's source path; Alias the disk's device alias.
	Path  string
	Alias string
	// Reason of an io-error event ("enospc", ...); Paused tells whether
	// the domain paused on it.
	Reason string
	Paused bool
	// At is when the event arrived; zero means when the Monitor read it.
	At time.Time
}

// DiskError is a pending I/O error of a disk, as libvirt keeps them.
type DiskError int

// Pending I/O errors: none, out of space, any other.
const (
	DiskErrorNone DiskError = iota
	DiskErrorNoSpace
	DiskErrorOther
)

// Domain is what a Monitor needs of a running libvirt domain.
type Domain interface {
	// Name identifies the domain in logs and metrics.
	Name() string
	// XML is the live domain XML, with the index attributes of every
	// image of every disk's chain.
	XML() (string, error)
	// Usage reads allocation, device size and capacity of a node.
	Usage(node Node) (Usage, error)
	// SetThreshold arms (or with 0 disarms) a node's write threshold.
	SetThreshold(node string, threshold uint64) error
	// PausedOnIOError reports whether the domain is paused because of a
	// disk I/O error.
	PausedOnIOError() (bool, error)
	// DiskErrors lists the disks, by target, with a pending I/O error.
	DiskErrors() (map[string]DiskError, error)
	// Resume resumes the paused domain.
	Resume() error
	// Events delivers the domain's threshold and io-error events. A
	// Domain may drop events when the receiver is slow: the Monitor's
	// poll makes up for them.
	Events() <-chan Event
}

// Disk is one thin-provisioned disk to monitor.
type Disk struct {
	// Target is the disk's target device, e.g. "vda".
	Target string
	// Device is the block device holding the qcow2 image; empty means
	// the first block device of the disk's chain from the top.
	Device string
	// Maximum is the device size at which the image can no longer grow
	// (see MaximumSize).
	Maximum int64
	// Extender grows the device.
	Extender Extender
}

// Trigger is what started an extension.
type Trigger string

// The triggers, by the value an Extension records.
const (
	TriggerStart     Trigger = "start"
	TriggerThreshold Trigger = "threshold"
	TriggerPoll      Trigger = "poll"
	TriggerNoSpace   Trigger = "enospc"
)

// Extension is the record of one extension attempt.
type Extension struct {
	Disk    string
	Trigger Trigger
	// Usage before the extension; Size the size asked for.
	Usage Usage
	Size  int64
	// Latency runs from the trigger to QEMU seeing the new size.
	Latency time.Duration
	Err     error
}

// Config assembles a Monitor.
type Config struct {
	Domain Domain
	Disks  []Disk
	Policy Policy
	// Metrics may be nil.
	Metrics *Metrics
	// Logger receives the Monitor's log, every state change at V(1); the
	// zero Logger discards it.
	Logger logr.Logger
	// Observe, when set, is called after every extension attempt.
	Observe func(Extension)
}

type disk struct {
	Disk
	node  Node
	state State
	// armed is the threshold currently set.
	armed uint64
}

// Monitor keeps the thin-provisioned disks of one domain ahead of the
// guest's writes. See the package documentation.
type Monitor struct {
	dom     Domain
	policy  Policy
	metrics *Metrics
	log     logr.Logger
	observe func(Extension)

	mu    sync.Mutex
	disks []*disk
}

// NewMonitor checks the configuration and makes a Monitor.
func NewMonitor(cfg Config) (*Monitor, error) {
	if cfg.Domain == nil {
		return nil, errors.New("thin-provisioning monitor: no domain")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	m := &Monitor{
		dom:     cfg.Domain,
		policy:  cfg.Policy.WithDefaults(),
		metrics: cfg.Metrics,
		log:     cfg.Logger.WithValues("domain", cfg.Domain.Name()),
		observe: cfg.Observe,
	}
	for _, d := range cfg.Disks {
		if d.Extender == nil || d.Maximum <= 0 || d.Target == "" {
			return nil, fmt.Errorf("thin-provisioning monitor: disk %q needs a target, a maximum size and an extender", d.Target)
		}
		m.disks = append(m.disks, &disk{Disk: d})
	}
	if len(m.disks) == 0 {
		return nil, errors.New("thin-provisioning monitor: no disks")
	}
	return m, nil
}

// State returns the state of the disk with the given target.
func (m *Monitor) State(target string) State {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.disks {
		if d.Target == target {
			return d.state
		}
	}
	return StateUnarmed
}

func (m *Monitor) setState(d *disk, to State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.state == to {
		return
	}
	if !CanTransition(d.state, to) {
		// A programming error: log it rather than corrupt the machine.
		m.log.Error(nil, "refused state transition", "disk", d.Target, "from", d.state, "to", to)
		return
	}
	m.log.V(1).Info("state", "disk", d.Target, "from", d.state, "to", to)
	d.state = to
}

// Run watches the disks until ctx ends. It starts from the disks' current
// allocation, so a restarted Monitor picks up where the last one stopped:
// it arms fresh thresholds, extends what is already short of room and
// resumes a domain paused for lack of space. Run returns nil when ctx
// ends, and an error only when it cannot start.
func (m *Monitor) Run(ctx context.Context) error {
	domXML, err := m.dom.XML()
	if err != nil {
		return fmt.Errorf("monitor domain %s: %w", m.dom.Name(), err)
	}
	for _, d := range m.disks {
		node, err := ResolveNode(domXML, d.Target, d.Device)
		if err != nil {
			return fmt.Errorf("monitor domain %s: %w", m.dom.Name(), err)
		}
		d.node = node
		m.setState(d, StateUnarmed)
		d.armed = 0
	}
	m.log.Info("monitoring", "disks", len(m.disks), "chunk", m.policy.ChunkSize, "threshold", m.policy.FreeThreshold)
	m.pollAll(ctx, TriggerStart)

	ticker := time.NewTicker(m.policy.PollInterval)
	defer ticker.Stop()
	events := m.dom.Events()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil // rely on the poll
				continue
			}
			m.handle(ctx, ev)
		case <-ticker.C:
			m.pollAll(ctx, TriggerPoll)
		}
	}
}

func (m *Monitor) handle(ctx context.Context, ev Event) {
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	switch ev.Kind {
	case EventThreshold:
		d := m.byNode(ev.Dev)
		if d == nil {
			return
		}
		m.log.Info("threshold crossed", "disk", d.Target, "node", ev.Dev)
		d.armed = 0 // libvirt drops a threshold once it fires
		m.service(ctx, d, TriggerThreshold, ev.At, false)
	case EventIOError:
		d := m.byPath(ev.Path, ev.Alias)
		if d == nil || ev.Reason != ReasonNoSpace {
			return
		}
		m.log.Info("out of space", "disk", d.Target, "paused", ev.Paused)
		if ev.Paused {
			m.metrics.paused(m.dom.Name(), d.Target)
		}
		m.service(ctx, d, TriggerNoSpace, ev.At, true)
		m.resumeIfReady(ctx)
	}
}

func (m *Monitor) byNode(name string) *disk {
	for _, d := range m.disks {
		if d.node.Name == name || (d.node.Active && d.Target == name) {
			return d
		}
	}
	return nil
}

func (m *Monitor) byPath(path, alias string) *disk {
	for _, d := range m.disks {
		if (path != "" && d.node.Path == path) || (alias != "" && d.node.Alias == alias) {
			return d
		}
	}
	return nil
}

// pollAll reads every disk, extends what needs it, arms what is unarmed and
// resumes a domain found paused for lack of space whose io-error event went
// missing.
func (m *Monitor) pollAll(ctx context.Context, trigger Trigger) {
	paused, err := m.dom.PausedOnIOError()
	if err != nil {
		m.log.Error(err, "read domain state")
	}
	var noSpace map[string]DiskError
	if paused {
		if noSpace, err = m.dom.DiskErrors(); err != nil {
			m.log.Error(err, "read disk errors")
		}
	}
	for _, d := range m.disks {
		if ctx.Err() != nil {
			return
		}
		force := noSpace[d.Target] == DiskErrorNoSpace
		t := trigger
		if force {
			t = TriggerNoSpace
			if trigger == TriggerPoll {
				// The io-error event of this pause was missed.
				m.metrics.paused(m.dom.Name(), d.Target)
			}
		}
		m.service(ctx, d, t, time.Now(), force)
	}
	if paused {
		m.resumeIfReady(ctx)
	}
}

// service brings one disk to a state with enough room and an armed
// threshold, extending as often as needed. force extends even when the
// free space looks sufficient (after ENOSPC).
func (m *Monitor) service(ctx context.Context, d *disk, trigger Trigger, since time.Time, force bool) {
	if d.state == StateAtMaximum {
		return
	}
	for ctx.Err() == nil {
		u, err := m.dom.Usage(d.node)
		if err != nil {
			m.log.Error(err, "read allocation", "disk", d.Target)
			return
		}
		if err := CheckAllocation(u, d.Maximum); err != nil {
			m.log.Error(err, "refusing to act", "disk", d.Target)
			return
		}
		m.metrics.usage(m.dom.Name(), d.Target, u)
		if u.Physical >= d.Maximum {
			m.disarm(d)
			m.setState(d, StateAtMaximum)
			m.log.Info("device at its maximum size", "disk", d.Target, "physical", u.Physical)
			return
		}
		if !force && !m.policy.NeedsExtension(u, d.Maximum) {
			if d.state == StateExceeded {
				// Room appeared without this monitor (an extension it
				// retried, or one made by hand).
				m.setState(d, StateUnarmed)
			}
			m.arm(d, u)
			// The guest may have crossed the new threshold before it was
			// set; QEMU would then never report it.
			if d.state == StateArmed {
				if u2, err := m.dom.Usage(d.node); err == nil && m.policy.NeedsExtension(u2, d.Maximum) {
					since = time.Now()
					continue
				}
			}
			return
		}
		m.setState(d, StateExceeded)
		if err := m.extend(ctx, d, u, trigger, since); err != nil {
			return // retried by the next poll
		}
		force = false
		since = time.Now()
	}
}

// arm sets the disk's threshold for its current device size.
func (m *Monitor) arm(d *disk, u Usage) {
	threshold := m.policy.Threshold(u.Physical)
	if d.state == StateArmed && d.armed == threshold {
		return
	}
	if err := m.dom.SetThreshold(d.node.Name, threshold); err != nil {
		m.log.Error(err, "arm threshold", "disk", d.Target, "node", d.node.Name)
		if d.state == StateArmed {
			m.setState(d, StateUnarmed)
		}
		return
	}
	d.armed = threshold
	m.setState(d, StateArmed)
	m.log.V(1).Info("armed", "disk", d.Target, "node", d.node.Name, "threshold", threshold)
}

func (m *Monitor) disarm(d *disk) {
	if d.armed == 0 {
		return
	}
	if err := m.dom.SetThreshold(d.node.Name, 0); err != nil {
		m.log.Error(err, "disarm threshold", "disk", d.Target)
	}
	d.armed = 0
}

// extend grows the disk's device one step and waits until QEMU sees it.
func (m *Monitor) extend(ctx context.Context, d *disk, u Usage, trigger Trigger, since time.Time) error {
	m.setState(d, StateExtending)
	size := m.policy.NextSize(u, d.Maximum)
	err := m.grow(ctx, d, size)
	latency := time.Since(since)
	m.metrics.extended(m.dom.Name(), d.Target, latency, err)
	if m.observe != nil {
		m.observe(Extension{Disk: d.Target, Trigger: trigger, Usage: u, Size: size, Latency: latency, Err: err})
	}
	if err != nil {
		m.log.Error(err, "extend", "disk", d.Target, "size", size)
		m.setState(d, StateExceeded)
		return err
	}
	m.log.Info("extended", "disk", d.Target, "trigger", trigger, "from", u.Physical, "to", size, "allocation", u.Allocation, "latency", latency)
	d.armed = 0
	m.setState(d, StateUnarmed)
	return nil
}

func (m *Monitor) grow(ctx context.Context, d *disk, size int64) error {
	got, err := d.Extender.Extend(ctx, size)
	if err != nil {
		return err
	}
	if got < size {
		return fmt.Errorf("extend %s: device has %d bytes after extending to %d", d.node.Path, got, size)
	}
	return m.waitVisible(ctx, d, size)
}

// waitVisible waits until libvirt reports (from QEMU) a device of at least
// size bytes.
func (m *Monitor) waitVisible(ctx context.Context, d *disk, size int64) error {
	ctx, cancel := context.WithTimeout(ctx, m.policy.VerifyTimeout)
	defer cancel()
	delay := time.Millisecond
	for {
		u, err := m.dom.Usage(d.node)
		if err != nil {
			return fmt.Errorf("verify extension of %s: %w", d.node.Path, err)
		}
		if u.Physical >= size {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("verify extension of %s: QEMU sees %d bytes, want %d: %w", d.node.Path, u.Physical, size, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// resumeIfReady resumes a domain paused on an I/O error once no monitored
// disk is short of room and no other disk has an error pending, if the
// policy says so.
func (m *Monitor) resumeIfReady(ctx context.Context) {
	if m.policy.Resume != AutoResume || ctx.Err() != nil {
		return
	}
	paused, err := m.dom.PausedOnIOError()
	if err != nil || !paused {
		return
	}
	for _, d := range m.disks {
		if d.state == StateExceeded || d.state == StateExtending {
			m.log.Info("staying paused: a disk still lacks room", "disk", d.Target)
			return
		}
	}
	errs, err := m.dom.DiskErrors()
	if err != nil {
		m.log.Error(err, "read disk errors")
		return
	}
	for target, e := range errs {
		if e == DiskErrorOther || (e == DiskErrorNoSpace && !m.canGrow(target)) {
			m.log.Info("staying paused: a disk has an error this monitor cannot fix", "disk", target)
			return
		}
	}
	if err := m.dom.Resume(); err != nil {
		m.log.Error(err, "resume")
		return
	}
	m.log.Info("resumed after extension")
}

// canGrow reports whether target is a monitored disk with room to write:
// a disk full at its maximum size cannot be helped by resuming.
func (m *Monitor) canGrow(target string) bool {
	for _, d := range m.disks {
		if d.Target != target {
			continue
		}
		if d.state != StateAtMaximum {
			return true
		}
		u, err := m.dom.Usage(d.node)
		return err == nil && u.Free() >= sizeAlignment
	}
	return false
}
