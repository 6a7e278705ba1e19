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
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// samples flattens what reg gathers: a counter's or gauge's value, a
// histogram's _count and _sum, each under name{label="value",...}.
func samples(reg *prometheus.Registry) map[string]float64 {
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.Counter != nil:
				out[f.GetName()+series] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[f.GetName()+series] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[f.GetName()+"_count"+series] = float64(m.GetHistogram().GetSampleCount())
				out[f.GetName()+"_sum"+series] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// counted is what the metrics must hold after step s of an operation of
// kind at s.location ("default" when empty), created s.after before the
// step ran.
func counted(kind string, s step) map[string]float64 {
	out := map[string]float64{}
	if s.ends == "" {
		return out
	}
	after := s.after
	if after == 0 {
		after = time.Minute
	}
	location := s.location
	if location == "" {
		location = "default"
	}
	series := fmt.Sprintf(`{kind=%q,location=%q}`, kind, location)
	byPhase := fmt.Sprintf(`{kind=%q,location=%q,phase=%q}`, kind, location, s.ends)
	out["kubevirt_datamover_operations_"+strings.ToLower(s.ends)+"_total"+series] = 1
	out["kubevirt_datamover_transferred_bytes_total"+series] = float64(s.bytes)
	out["kubevirt_datamover_operation_duration_seconds_count"+byPhase] = 1
	out["kubevirt_datamover_operation_duration_seconds_sum"+byPhase] = after.Seconds()
	if s.ends == "Completed" {
		out["kubevirt_datamover_transfer_duration_seconds_count"+series] = 1
		out["kubevirt_datamover_transfer_duration_seconds_sum"+series] = s.transfer.Seconds()
	}
	return out
}

// startedAt is o with its pod running since 30 s after its creation.
func startedAt[T *velerov2.DataUpload | *velerov2.DataDownload](o T) T {
	at := metav1.NewTime(created.Add(30 * time.Second))
	switch x := any(o).(type) {
	case *velerov2.DataUpload:
		x.Status.StartTimestamp = &at
	case *velerov2.DataDownload:
		x.Status.StartTimestamp = &at
	}
	return o
}

var _ = Describe("the data mover's metrics", func() {
	succeeded := step{objs: append(uploadTemporaries()[1:], moverPod(uploadChild, corev1.PodSucceeded,
		`{"checkpoint":"cp-1","type":"full","bytes":42,"path":"checkpoints/prod/db/cp-1"}`)),
		ends: "Completed", bytes: 42, transfer: 30 * time.Second}
	reconciler := func(t *stepper, m *Metrics) *DataUploadReconciler {
		r := &DataUploadReconciler{Client: t.c, Reader: t.c, Recorder: t.recorder, Config: Config{Identity: "node-1"},
			Now: t.clock.Now, Metrics: m, openRepository: t.repository}
		r.Config.defaults()
		return r
	}
	get := func(t *stepper, du *velerov2.DataUpload) *velerov2.DataUpload {
		out := &velerov2.DataUpload{}
		Expect(t.c.Get(t.ctx, client.ObjectKeyFromObject(du), out)).To(Succeed())
		return out
	}

	It("counts an end once: not again when the ended object is reconciled again, nor after a restart", func() {
		du := startedAt(newUpload(velerov2.DataUploadPhaseInProgress))
		t := newStepper(succeeded, du)
		r := reconciler(t, t.metrics)
		_, err := r.Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		Expect(get(t, du).Status.Phase).To(Equal(velerov2.DataUploadPhaseCompleted))
		Expect(samples(t.registry)).To(Equal(counted(KindLabelDataUpload, succeeded)))

		_, err = r.Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		Expect(samples(t.registry)).To(Equal(counted(KindLabelDataUpload, succeeded)), "the same controller again")

		restarted := prometheus.NewRegistry()
		m, err := NewMetrics(restarted, nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = reconciler(t, m).Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		Expect(samples(restarted)).To(BeEmpty(), "a restarted controller")
	})

	It("counts no end that a stale copy tried to write after another one ended the operation", func() {
		du := startedAt(newUpload(velerov2.DataUploadPhaseInProgress))
		t := newStepper(succeeded, du)
		stale := get(t, du)
		_, err := reconciler(t, t.metrics).Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())

		other := prometheus.NewRegistry()
		m, err := NewMetrics(other, nil)
		Expect(err).NotTo(HaveOccurred())
		_, err = reconciler(t, m).op(stale).fail(t.ctx, "timed out")
		Expect(apierrors.IsConflict(err)).To(BeTrue(), "%v", err)
		Expect(samples(other)).To(BeEmpty())
		Expect(get(t, du).Status.Phase).To(Equal(velerov2.DataUploadPhaseCompleted))
	})

	It("counts the operations in progress from the cache, by kind, location and phase", func() {
		upload := func(name, location string, phase velerov2.DataUploadPhase) client.Object {
			return with(newUpload(phase), func(du *velerov2.DataUpload) { du.Name, du.Spec.BackupStorageLocation = name, location })
		}
		download := func(name string, phase velerov2.DataDownloadPhase) client.Object {
			return with(newDownload(phase), func(dd *velerov2.DataDownload) { dd.Name = name })
		}
		c := fakeAPI(nil,
			upload("a", "default", ""), upload("b", "default", velerov2.DataUploadPhaseInProgress),
			upload("c", "default", velerov2.DataUploadPhaseInProgress), upload("d", "other", velerov2.DataUploadPhaseInProgress),
			upload("e", "default", velerov2.DataUploadPhaseCompleted), upload("f", "default", velerov2.DataUploadPhaseCanceled),
			with(upload("g", "default", velerov2.DataUploadPhaseInProgress), func(o client.Object) {
				o.(*velerov2.DataUpload).Spec.DataMover = "velero"
			}),
			download("h", velerov2.DataDownloadPhasePrepared), download("i", velerov2.DataDownloadPhaseFailed))
		reg := prometheus.NewRegistry()
		_, err := NewMetrics(reg, c)
		Expect(err).NotTo(HaveOccurred())
		Expect(samples(reg)).To(Equal(map[string]float64{
			`kubevirt_datamover_operations_in_progress{kind="DataUpload",location="default",phase="New"}`:        1,
			`kubevirt_datamover_operations_in_progress{kind="DataUpload",location="default",phase="InProgress"}`: 2,
			`kubevirt_datamover_operations_in_progress{kind="DataUpload",location="other",phase="InProgress"}`:   1,
			`kubevirt_datamover_operations_in_progress{kind="DataDownload",location="default",phase="Prepared"}`: 1,
		}))
	})

	It("names every metric as Prometheus' linter wants", func() {
		du := startedAt(newUpload(velerov2.DataUploadPhaseInProgress))
		s := succeeded
		s.objs = append(slices.Clone(succeeded.objs), with(newUpload(velerov2.DataUploadPhaseAccepted), func(du *velerov2.DataUpload) {
			du.Name = "hourly-db"
		}))
		t := newStepper(s, du)
		m, err := NewMetrics(prometheus.NewRegistry(), t.c)
		Expect(err).NotTo(HaveOccurred())
		_, err = reconciler(t, m).Reconcile(t.ctx, request(du))
		Expect(err).NotTo(HaveOccurred())
		m.ended(newUpload(velerov2.DataUploadPhaseFailed), "Failed", nil, nil)
		m.ended(newUpload(velerov2.DataUploadPhaseCanceled), "Canceled", nil, nil)
		Expect(testutil.CollectAndCount(m)).To(Equal(7), "a series of each metric")
		Expect(testutil.CollectAndLint(m)).To(BeEmpty())
	})
})
