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

package datamover

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Label values of the kind label: the kinds of Velero's resources.
const (
	KindLabelDataUpload   = "DataUpload"
	KindLabelDataDownload = "DataDownload"
)

// durationBuckets go from a second to eight hours, twice the default
// operation timeout.
var durationBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800}

// listTimeout bounds the cache reads of one scrape.
const listTimeout = 10 * time.Second

// Metrics are the data mover's Prometheus metrics, as Velero's node-agent
// counts its own data movers' outcomes. Outcomes, bytes and durations are
// recorded by the controller that ends an operation, once (see
// operation.setStatus); the operations not ended yet are counted from the
// cache at every scrape, so they are right after a restart too.
type Metrics struct {
	completed, failed, canceled *prometheus.CounterVec
	bytes                       *prometheus.CounterVec
	duration                    *prometheus.HistogramVec
	transfer                    *prometheus.HistogramVec
	live                        *prometheus.Desc
	// reader lists the DataUploads and DataDownloads; nil counts none.
	reader client.Reader
}

// NewMetrics registers the data mover's metrics on reg; reader (the
// manager's cache) gives the operations in progress.
func NewMetrics(reg prometheus.Registerer, reader client.Reader) (*Metrics, error) {
	labels := []string{"kind", "location"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubevirt_datamover_" + name, Help: help}, labels)
	}
	m := &Metrics{
		completed: counter("operations_completed_total", "DataUploads and DataDownloads of the kubevirt data mover that completed."),
		failed:    counter("operations_failed_total", "DataUploads and DataDownloads of the kubevirt data mover that failed."),
		canceled:  counter("operations_canceled_total", "DataUploads and DataDownloads of the kubevirt data mover that were canceled."),
		bytes: counter("transferred_bytes_total",
			"Bytes DataUploads stored and DataDownloads read, as their status.progress.bytesDone said when they ended."),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubevirt_datamover_operation_duration_seconds",
			Help:    "Time from a DataUpload's or DataDownload's creation to its end, by the phase it ended in.",
			Buckets: durationBuckets,
		}, append(labels, "phase")),
		transfer: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubevirt_datamover_transfer_duration_seconds",
			Help:    "Time a completed DataUpload's or DataDownload's pod took, from running to its result.",
			Buckets: durationBuckets,
		}, labels),
		live: prometheus.NewDesc("kubevirt_datamover_operations_in_progress",
			"DataUploads and DataDownloads of the kubevirt data mover not ended yet, by phase.",
			append(labels, "phase"), nil),
		reader: reader,
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("register the data mover's metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) vectors() []prometheus.Collector {
	return []prometheus.Collector{m.completed, m.failed, m.canceled, m.bytes, m.duration, m.transfer}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.vectors() {
		c.Describe(ch)
	}
	ch <- m.live
}

// Collect implements prometheus.Collector. A scrape whose cache read fails
// has no in-progress counts rather than wrong ones; the other metrics are
// still served.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.vectors() {
		c.Collect(ch)
	}
	if m.reader == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	counts, err := m.inProgress(ctx)
	if err != nil {
		return
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.live, prometheus.GaugeValue, float64(n), k.kind, k.location, k.phase)
	}
}

type liveKey struct{ kind, location, phase string }

// inProgress counts this data mover's operations that have not ended.
func (m *Metrics) inProgress(ctx context.Context) (map[liveKey]int, error) {
	counts := map[liveKey]int{}
	uploads := &velerov2.DataUploadList{}
	if err := m.reader.List(ctx, uploads); err != nil {
		return nil, fmt.Errorf("list DataUploads: %w", err)
	}
	for _, du := range uploads.Items {
		if du.Spec.DataMover == DataMover && !uploadDone(du.Status.Phase) {
			counts[liveKey{KindLabelDataUpload, du.Spec.BackupStorageLocation, phaseName(du.Status.Phase)}]++
		}
	}
	downloads := &velerov2.DataDownloadList{}
	if err := m.reader.List(ctx, downloads); err != nil {
		return nil, fmt.Errorf("list DataDownloads: %w", err)
	}
	for _, dd := range downloads.Items {
		if dd.Spec.DataMover == DataMover && !downloadDone(dd.Status.Phase) {
			counts[liveKey{KindLabelDataDownload, dd.Spec.BackupStorageLocation, phaseName(dd.Status.Phase)}]++
		}
	}
	return counts, nil
}

// ended records the end of obj, a DataUpload or DataDownload that has just
// moved into phase with the timestamps given. A nil *Metrics records
// nothing.
func (m *Metrics) ended(obj client.Object, phase string, start, completion *metav1.Time) {
	if m == nil {
		return
	}
	var kind, location string
	var bytes int64
	// transferred is when the pod's result came: the end, but for a
	// restore the moment its result was kept, before its volume was bound
	// to the target claim.
	transferred := completion
	switch o := obj.(type) {
	case *velerov2.DataUpload:
		kind, location, bytes = KindLabelDataUpload, o.Spec.BackupStorageLocation, o.Status.Progress.BytesDone
	case *velerov2.DataDownload:
		kind, location, bytes = KindLabelDataDownload, o.Spec.BackupStorageLocation, o.Status.Progress.BytesDone
		if t, err := time.Parse(time.RFC3339, o.Annotations[AnnotationRestoreFinished]); err == nil {
			transferred = &metav1.Time{Time: t}
		}
	default:
		return
	}
	switch phase {
	case "Completed":
		m.completed.WithLabelValues(kind, location).Inc()
		if start != nil && transferred != nil {
			m.transfer.WithLabelValues(kind, location).Observe(transferred.Sub(start.Time).Seconds())
		}
	case "Failed":
		m.failed.WithLabelValues(kind, location).Inc()
	case "Canceled":
		m.canceled.WithLabelValues(kind, location).Inc()
	default:
		return
	}
	m.bytes.WithLabelValues(kind, location).Add(float64(bytes))
	if completion != nil {
		m.duration.WithLabelValues(kind, location, phase).Observe(completion.Sub(obj.GetCreationTimestamp().Time).Seconds())
	}
}

// phaseEnded tells a final phase; DataUploads and DataDownloads name them
// alike.
func phaseEnded(phase string) bool {
	return phase == "Completed" || phase == "Failed" || phase == "Canceled"
}
