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
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/thinp"
)

var _ = Describe("Monitor", func() {
	const (
		chunk   = 64 * mib
		free    = 32 * mib
		maximum = 1 * gib
	)
	var (
		dom      *fakeDomain
		policy   thinp.Policy
		registry *prometheus.Registry
		metrics  *thinp.Metrics
		recorded []thinp.Extension
		recMu    sync.Mutex
		logger   logr.Logger
	)

	BeforeEach(func() {
		dom = newFakeDomain(chunk, maximum-8*mib)
		// Only events drive the monitor unless a spec polls.
		policy = thinp.Policy{ChunkSize: chunk, FreeThreshold: free, PollInterval: time.Hour, VerifyTimeout: time.Second}
		registry = prometheus.NewRegistry()
		var err error
		metrics, err = thinp.NewMetrics(registry)
		Expect(err).ToNot(HaveOccurred())
		recMu.Lock()
		recorded = nil
		recMu.Unlock()
		logger = logr.Discard()
	})

	start := func() *thinp.Monitor {
		m, err := thinp.NewMonitor(thinp.Config{
			Domain:  dom,
			Disks:   []thinp.Disk{{Target: "vda", Maximum: maximum, Extender: dom.extender()}},
			Policy:  policy,
			Metrics: metrics,
			Logger:  logger,
			Observe: func(e thinp.Extension) {
				recMu.Lock()
				defer recMu.Unlock()
				recorded = append(recorded, e)
			},
		})
		Expect(err).ToNot(HaveOccurred())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- m.Run(ctx) }()
		DeferCleanup(func() {
			cancel()
			Eventually(done).Should(Receive(BeNil()))
		})
		return m
	}
	triggers := func() []thinp.Trigger {
		recMu.Lock()
		defer recMu.Unlock()
		var t []thinp.Trigger
		for _, e := range recorded {
			t = append(t, e.Trigger)
		}
		return t
	}
	thresholds := func() map[string]uint64 {
		_, th, _ := dom.snapshot()
		return th
	}

	It("arms the threshold on the indexed node of the image on the block device", func() {
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(thresholds()).To(Equal(map[string]uint64{"vda[2]": uint64(chunk - free)}))
		Expect(dom.extensions()).To(BeEmpty())
	})

	It("logs to the configured logger, every state change at V(1)", func() {
		var (
			mu    sync.Mutex
			lines []string
		)
		logged := func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), lines...)
		}
		logger = funcr.New(func(_, args string) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, args)
		}, funcr.Options{Verbosity: 1})
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(chunk - free + mib)).To(BeTrue())
		Eventually(dom.extensions).Should(Equal([]int64{2 * chunk}))
		Eventually(logged).Should(ContainElements(
			MatchRegexp(`"msg"="monitoring" "domain"="guest" "disks"=1`),
			MatchRegexp(`"level"=1 "msg"="state" "domain"="guest" "disk"="vda" "from"="unarmed" "to"="armed"`),
			MatchRegexp(`"msg"="extended" "domain"="guest" "disk"="vda" "trigger"="threshold"`),
		))
	})

	It("extends by a chunk when the threshold fires and re-arms for the new size", func() {
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))

		Expect(dom.write(chunk - free + mib)).To(BeTrue())
		Eventually(dom.extensions).Should(Equal([]int64{2 * chunk}))
		Eventually(thresholds).Should(Equal(map[string]uint64{"vda[2]": uint64(2*chunk - free)}))
		Expect(m.State("vda")).To(Equal(thinp.StateArmed))
		Expect(triggers()).To(Equal([]thinp.Trigger{thinp.TriggerThreshold}))

		By("growing chunk by chunk as the guest keeps writing")
		for i := int64(2); i < 5; i++ {
			Expect(dom.write(chunk)).To(BeTrue())
			Eventually(dom.physical).Should(Equal((i + 1) * chunk))
		}
		Eventually(thresholds).Should(Equal(map[string]uint64{"vda[2]": uint64(5*chunk - free)}))
		_, _, paused := dom.snapshot()
		Expect(paused).To(BeFalse())

		Expect(metricValue(registry, "thinp_extensions_total", map[string]string{"result": "success"})).To(BeEquivalentTo(4))
		Expect(metricValue(registry, "thinp_extension_duration_seconds", nil)).To(BeEquivalentTo(4), "latency observations")
		Expect(metricValue(registry, "thinp_physical_bytes", nil)).To(BeEquivalentTo(5 * chunk))
	})

	It("waits until QEMU sees the new size before re-arming", func() {
		dom.set(func(f *fakeDomain) { f.lagAfterExtend = 5 })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(chunk - free + mib)).To(BeTrue())
		Eventually(thresholds).Should(Equal(map[string]uint64{"vda[2]": uint64(2*chunk - free)}))
		Expect(dom.extensions()).To(Equal([]int64{2 * chunk}))
	})

	It("starts from the current allocation: a restarted monitor extends a disk already short of room", func() {
		dom.set(func(f *fakeDomain) { f.usage.Allocation = chunk - mib })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.extensions()).To(Equal([]int64{2 * chunk}))
		Expect(thresholds()).To(Equal(map[string]uint64{"vda[2]": uint64(2*chunk - free)}))
		Expect(triggers()).To(Equal([]thinp.Trigger{thinp.TriggerStart}))
	})

	It("catches a missed threshold event with the poll", func() {
		policy.PollInterval = 20 * time.Millisecond
		dom.set(func(f *fakeDomain) { f.dropEvents = true })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(chunk - free + mib)).To(BeTrue())
		Eventually(dom.extensions).Should(Equal([]int64{2 * chunk}))
		Eventually(thresholds).Should(Equal(map[string]uint64{"vda[2]": uint64(2*chunk - free)}))
		Expect(triggers()).To(Equal([]thinp.Trigger{thinp.TriggerPoll}))
	})

	It("extends as often as needed when the guest wrote more than a chunk meanwhile", func() {
		dom.set(func(f *fakeDomain) { f.usage.Physical = 4 * chunk; f.usage.Allocation = 4*chunk - mib })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.extensions()).To(Equal([]int64{5 * chunk}))
	})

	DescribeTable("an ENOSPC pause",
		func(resume thinp.ResumeBehavior, resumed bool) {
			policy.Resume = resume
			m := start()
			Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
			By("writing past the device's end at once, faster than any extension")
			Expect(dom.write(2 * chunk)).To(BeFalse())

			Eventually(dom.extensions).Should(Equal([]int64{2 * chunk}))
			Eventually(thresholds).Should(Equal(map[string]uint64{"vda[2]": uint64(2*chunk - free)}))
			Eventually(func() bool { _, _, p := dom.snapshot(); return p }).Should(Equal(!resumed))
			Consistently(func() bool { _, _, p := dom.snapshot(); return p }, "50ms").Should(Equal(!resumed))
			Expect(triggers()).To(ContainElement(thinp.TriggerNoSpace))
			Expect(metricValue(registry, "thinp_enospc_pauses_total", nil)).To(BeEquivalentTo(1))
		},
		Entry("resumes the domain with auto-resume", thinp.AutoResume, true),
		Entry("leaves it paused when told to", thinp.LeavePaused, false),
	)

	It("resumes a domain it finds paused for lack of space when the io-error event went missing", func() {
		policy.PollInterval = 20 * time.Millisecond
		dom.set(func(f *fakeDomain) { f.dropEvents = true })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(2 * chunk)).To(BeFalse())
		Eventually(func() bool { _, _, p := dom.snapshot(); return p }).Should(BeFalse())
		Expect(dom.physical()).To(Equal(2 * chunk))
	})

	It("stays paused while another disk has an error it cannot fix", func() {
		dom.set(func(f *fakeDomain) { f.otherError = true })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(2 * chunk)).To(BeFalse())
		Eventually(dom.extensions).Should(Equal([]int64{2 * chunk}))
		Consistently(func() bool { _, _, p := dom.snapshot(); return p }, "100ms").Should(BeTrue())
	})

	It("stops at the maximum size and disarms", func() {
		dom.set(func(f *fakeDomain) {
			f.usage.Physical = maximum - chunk/2
			f.usage.Allocation = maximum - chunk/2 - mib
		})
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateAtMaximum))
		Expect(dom.extensions()).To(Equal([]int64{maximum}))
		Expect(thresholds()).To(BeEmpty())
	})

	It("retries a failed extension at the next poll", func() {
		policy.PollInterval = 20 * time.Millisecond
		dom.set(func(f *fakeDomain) { f.extendErr = errors.New("volume group full") })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.write(chunk - free + mib)).To(BeTrue())
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateExceeded))
		Eventually(func() float64 {
			return metricValue(registry, "thinp_extensions_total", map[string]string{"result": "failure"})
		}).Should(BeNumerically(">=", 2))

		dom.set(func(f *fakeDomain) { f.extendErr = nil })
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.extensions()).To(Equal([]int64{2 * chunk}))
	})

	It("extends past an allocation a write that failed with ENOSPC left beyond the end of the device", func() {
		// QEMU's wr_highest_offset counts a failed write's end too.
		dom.set(func(f *fakeDomain) { f.usage.Allocation = chunk + 18944 })
		m := start()
		Eventually(m.State).WithArguments("vda").Should(Equal(thinp.StateArmed))
		Expect(dom.extensions()).To(Equal([]int64{2*chunk + mib}), "a chunk past the allocation, in MiB")
	})

	It("refuses to act on an improbable allocation", func() {
		dom.set(func(f *fakeDomain) { f.usage.Allocation = maximum + chunk })
		m := start()
		Consistently(dom.extensions, "100ms").Should(BeEmpty())
		Expect(m.State("vda")).To(Equal(thinp.StateUnarmed))
	})

	It("refuses an invalid configuration", func() {
		_, err := thinp.NewMonitor(thinp.Config{Domain: dom, Disks: []thinp.Disk{{Target: "vda", Maximum: gib}}})
		Expect(err).To(MatchError(ContainSubstring(`disk "vda" needs a target, a maximum size and an extender`)))
		_, err = thinp.NewMonitor(thinp.Config{Domain: dom, Policy: thinp.Policy{ChunkSize: mib, FreeThreshold: 2 * mib},
			Disks: []thinp.Disk{{Target: "vda", Maximum: gib, Extender: dom.extender()}}})
		Expect(err).To(MatchError(ContainSubstring("is not below the chunk size")))
	})

	It("fails to start on a disk that is not on a block device", func() {
		m, err := thinp.NewMonitor(thinp.Config{Domain: dom, Policy: policy,
			Disks: []thinp.Disk{{Target: "vda", Device: "/dev/loop1", Maximum: gib, Extender: dom.extender()}}})
		Expect(err).ToNot(HaveOccurred())
		Expect(m.Run(context.Background())).To(MatchError(ContainSubstring("monitor domain guest: resolve disk vda: no image of its chain is on /dev/loop1")))
	})
})

// metricValue reads one series of a registry, picked by name and labels:
// a counter's or gauge's value, a histogram's count of observations.
func metricValue(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	families, err := reg.Gather()
	Expect(err).ToNot(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}
