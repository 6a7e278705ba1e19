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
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus series a Monitor keeps. All carry the labels
// domain and disk.
type Metrics struct {
	extensions *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	pauses     *prometheus.CounterVec
	allocated  *prometheus.GaugeVec
	physical   *prometheus.GaugeVec
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{"domain", "disk"}
	m := &Metrics{
		extensions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "thinp_extensions_total",
			Help: "Extensions of a thin-provisioned disk's block device, by result (success, failure).",
		}, append(labels, "result")),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "thinp_extension_duration_seconds",
			Help: "Time from a disk needing room (threshold event, poll or ENOSPC) to QEMU seeing the extended device.",
			// 5 ms to about 80 s.
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 15),
		}, labels),
		pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "thinp_enospc_pauses_total",
			Help: "Pauses of the domain because a thin-provisioned disk ran out of space.",
		}, labels),
		allocated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "thinp_allocated_bytes",
			Help: "Highest offset the qcow2 image has written on its block device.",
		}, labels),
		physical: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "thinp_physical_bytes",
			Help: "Size of the block device under a thin-provisioned disk.",
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.extensions, m.latency, m.pauses, m.allocated, m.physical} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register thin-provisioning metrics: %w", err)
		}
	}
	return m, nil
}

// The methods below accept a nil *Metrics, for monitors without metrics.

func (m *Metrics) extended(domain, disk string, took time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.extensions.WithLabelValues(domain, disk, "failure").Inc()
		return
	}
	m.extensions.WithLabelValues(domain, disk, "success").Inc()
	m.latency.WithLabelValues(domain, disk).Observe(took.Seconds())
}

func (m *Metrics) paused(domain, disk string) {
	if m == nil {
		return
	}
	m.pauses.WithLabelValues(domain, disk).Inc()
}

func (m *Metrics) usage(domain, disk string, u Usage) {
	if m == nil {
		return
	}
	m.allocated.WithLabelValues(domain, disk).Set(float64(u.Allocation))
	m.physical.WithLabelValues(domain, disk).Set(float64(u.Physical))
}
