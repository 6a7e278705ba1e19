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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/thinp/testbed"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// deafDomain loses every event of the domain, as a monitor that lost its
// libvirt connection for a while would.
type deafDomain struct{ thinp.Domain }

func (deafDomain) Events() <-chan thinp.Event { return nil }

// slowExtender makes every extension take at least delay, as storage that
// answers slowly would.
func slowExtender(delay time.Duration) func(thinp.Extender) thinp.Extender {
	return func(inner thinp.Extender) thinp.Extender {
		return thinp.ExtenderFunc(func(ctx context.Context, size int64) (int64, error) {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return 0, ctx.Err()
			}
			return inner.Extend(ctx, size)
		})
	}
}

// thresholdsOnly is a policy whose fallback poll never runs during a spec,
// so that every extension after the first arming comes from a threshold
// event. With the default poll, a poll that reads the disk between the
// guest crossing the threshold and libvirt's event reaching the monitor
// extends first, which is right but makes "poll" the trigger: on a loaded
// machine that happened in 1 run of 10.
func thresholdsOnly(chunk, free int64) thinp.Policy {
	return thinp.Policy{ChunkSize: chunk, FreeThreshold: free, PollInterval: time.Hour}
}

var _ = Describe("A thin-provisioned qcow2 disk on a loop device", func() {
	const (
		chunk = 4 * mib
		free  = 2 * mib
	)
	var name string

	guest := func(ctx context.Context, spec string, written int64, delayMicros uint32) *testbed.Guest {
		name = "thinp-" + spec
		return env.StartGuest(ctx, testbed.GuestOptions{
			Name:        name,
			VirtualSize: gib,
			DeviceSize:  chunk,
			Dir:         GinkgoT().TempDir(),
			Writer: testenv.GuestParams{
				StartLBA: 1, Sectors: uint32(written / testenv.SectorSize),
				ProgressEvery: 64, DelayMicros: delayMicros, Seed: 0x7e57,
			},
		})
	}

	It("grows chunk by chunk without pausing a guest that writes at a moderate rate", func(ctx context.Context) {
		g := guest(ctx, "moderate", 24*mib, 1000)
		m := g.StartMonitor(testbed.MonitorOptions{Policy: thresholdsOnly(chunk, free)})

		By("arming the threshold on the overlay's node, vda[index of the image on the loop device]")
		Eventually(m.State).WithContext(ctx).WithArguments(testbed.Target).Should(Equal(thinp.StateArmed))
		dom := g.DomainXML(ctx)
		index := dom.Devices.Disks[0].Source.Index
		Expect(index).ToNot(BeZero())

		g.Wait(ctx)
		Expect(domainState(ctx, name)).To(Equal(testenv.StateRunning))
		exts := m.Extensions()
		Expect(m.Failed()).To(BeEmpty())
		Expect(len(exts)).To(BeNumerically(">=", 5), "24 MiB written over a 4 MiB device in 4 MiB chunks")
		Expect(exts[0].Usage.Physical).To(Equal(chunk), "the first extension grows the device from its initial size")
		for i, e := range exts {
			Expect(e.Trigger).To(Equal(thinp.TriggerThreshold), "extension %d", i)
			Expect(e.Size).To(Equal(e.Usage.Physical+chunk), "extension %d grows by one chunk", i)
			if i > 0 {
				Expect(e.Usage.Physical).To(Equal(exts[i-1].Size), "extension %d starts where the last ended", i)
			}
		}
		Expect(testenv.DeviceSize(g.Device)).To(Equal(exts[len(exts)-1].Size))
		g.Verify(ctx)
	}, NodeTimeout(5*time.Minute))

	It("pauses a guest that outruns the extensions on ENOSPC and resumes it, the guest never seeing an error", func(ctx context.Context) {
		g := guest(ctx, "enospc", 16*mib, 0)
		m := g.StartMonitor(testbed.MonitorOptions{
			Policy:       thinp.Policy{ChunkSize: mib, FreeThreshold: mib / 2},
			WrapExtender: slowExtender(200 * time.Millisecond),
		})
		g.Wait(ctx)
		Expect(m.Failed()).To(BeEmpty())
		Expect(m.Triggers()).To(ContainElement(thinp.TriggerNoSpace), "the guest ran out of space at least once")
		Expect(domainState(ctx, name)).To(Equal(testenv.StateRunning))
		g.Verify(ctx)
	}, NodeTimeout(5*time.Minute))

	It("re-arms from the current allocation after a monitor restart", func(ctx context.Context) {
		g := guest(ctx, "restart", 24*mib, 1000)
		first := g.StartMonitor(testbed.MonitorOptions{Policy: thresholdsOnly(chunk, free)})
		Eventually(func() int { return len(first.Extensions()) }).WithContext(ctx).Should(BeNumerically(">=", 1))
		first.Stop()
		stoppedAt := g.Usage().Physical

		By("letting the guest cross the last threshold while no monitor runs")
		Eventually(func() int64 { return g.Usage().Free() }).WithContext(ctx).Should(BeNumerically("<", free))
		second := g.StartMonitor(testbed.MonitorOptions{Policy: thresholdsOnly(chunk, free)})
		Eventually(second.Extensions).WithContext(ctx).ShouldNot(BeEmpty())
		restart := second.Extensions()[0]
		Expect(restart.Trigger).To(BeElementOf(thinp.TriggerStart, thinp.TriggerNoSpace))
		Expect(restart.Usage.Physical).To(Equal(stoppedAt))

		g.Wait(ctx)
		Expect(second.Failed()).To(BeEmpty())
		Expect(second.Triggers()[1:]).To(HaveEach(thinp.TriggerThreshold), "the restarted monitor armed thresholds again")
		g.Verify(ctx)
	}, NodeTimeout(5*time.Minute))

	It("catches missed threshold events with the poll", func(ctx context.Context) {
		g := guest(ctx, "poll", 16*mib, 1000)
		m := g.StartMonitor(testbed.MonitorOptions{
			Policy:     thinp.Policy{ChunkSize: chunk, FreeThreshold: free, PollInterval: 100 * time.Millisecond},
			WrapDomain: func(d thinp.Domain) thinp.Domain { return deafDomain{d} },
		})
		g.Wait(ctx)
		Expect(m.Failed()).To(BeEmpty())
		Expect(len(m.Triggers())).To(BeNumerically(">=", 3))
		Expect(m.Triggers()).To(HaveEach(thinp.TriggerPoll))
		g.Verify(ctx)
	}, NodeTimeout(5*time.Minute))
})

func domainState(ctx context.Context, name string) (testenv.DomainState, error) {
	state, _, err := env.Libvirtd.DomainState(ctx, name)
	return state, err
}
