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

package datamover_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/vmware-tanzu/velero/pkg/apis/velero/shared"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
)

// scrape reads the controller's metrics endpoint as Prometheus does.
func scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", metricsURL, resp.Status)
	}
	var parser expfmt.TextParser
	return parser.TextToMetricFamilies(resp.Body)
}

// sample is the value of name's series with exactly labels (name, value,
// ...): a counter's or gauge's value, a histogram's count of observations
// and their sum; found is false when there is no such series.
func sample(families map[string]*dto.MetricFamily, name string, labels ...string) (value, sum float64, found bool) {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range families[name].GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		match := true
		for _, l := range m.GetLabel() {
			match = match && want[l.GetName()] == l.GetValue()
		}
		if !match {
			continue
		}
		switch {
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), 0, true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), 0, true
		}
	}
	return 0, 0, false
}

var _ = Describe("the controller's metrics endpoint", func() {
	It("counts a real backup's outcome, bytes and durations, and the backup told its total before moving a byte", func(ctx context.Context) {
		vm := newVM(ctx)
		loc := newLocation(ctx, velerov1.BackupStorageLocationPhaseAvailable)
		kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = true })
		w, err := k8s.Watch(ctx, &velerov2.DataUploadList{}, client.InNamespace(veleroNamespace))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(w.Stop)
		du := newDataUpload(ctx, vm, loc, "scraped")
		kind := datamover.KindLabelDataUpload

		By("the upload in progress, counted from the controller's cache")
		Eventually(func(g Gomega) {
			families, err := scrape(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			n, _, found := sample(families, "kubevirt_datamover_operations_in_progress", "kind", kind, "location", loc.name, "phase", "Accepted")
			g.Expect(found).To(BeTrue())
			g.Expect(n).To(Equal(1.0))
		}).Should(Succeed())
		kubevirt.set(vm.namespace, vm.name, func(v *standInVM) { v.hold = false })

		By("every change of the upload until it completed")
		var reported []shared.DataMoveOperationProgress
		phase := velerov2.DataUploadPhase("")
		Eventually(func() velerov2.DataUploadPhase {
			for {
				select {
				case ev, open := <-w.ResultChan():
					Expect(open).To(BeTrue(), "the watch of DataUploads ended")
					got, ok := ev.Object.(*velerov2.DataUpload)
					if !ok || got.Name != du.Name {
						continue
					}
					if got.Status.Progress != (shared.DataMoveOperationProgress{}) &&
						(len(reported) == 0 || reported[len(reported)-1] != got.Status.Progress) {
						reported = append(reported, got.Status.Progress)
					}
					phase = got.Status.Phase
				default:
					return phase
				}
			}
		}).WithTimeout(2 * time.Minute).Should(Equal(velerov2.DataUploadPhaseCompleted))
		done := getDataUpload(ctx, du)
		bytes, err := strconv.ParseInt((*done.Status.DataMoverResult)[datamover.ResultBytes], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		Expect(bytes).To(BeNumerically(">", 4<<20))
		Expect(reported).NotTo(BeEmpty())
		Expect(reported[0]).To(Equal(shared.DataMoveOperationProgress{TotalBytes: bytes, BytesDone: 0}),
			"the first progress the upload reported: the whole size before a byte moved")
		for _, p := range reported {
			Expect(p.TotalBytes).To(Equal(bytes), "totalBytes stays the total to move: %v", reported)
		}
		Expect(done.Status.Progress).To(Equal(shared.DataMoveOperationProgress{TotalBytes: bytes, BytesDone: bytes}))

		By("the outcome, the bytes and the durations on the endpoint")
		took := done.Status.CompletionTimestamp.Sub(done.CreationTimestamp.Time).Seconds()
		Eventually(func(g Gomega) {
			families, err := scrape(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			n, _, _ := sample(families, "kubevirt_datamover_operations_completed_total", "kind", kind, "location", loc.name)
			g.Expect(n).To(Equal(1.0), "completed")
			_, _, found := sample(families, "kubevirt_datamover_operations_failed_total", "kind", kind, "location", loc.name)
			g.Expect(found).To(BeFalse(), "failed")
			n, _, _ = sample(families, "kubevirt_datamover_transferred_bytes_total", "kind", kind, "location", loc.name)
			g.Expect(n).To(Equal(float64(bytes)), "bytes")
			n, sum, _ := sample(families, "kubevirt_datamover_operation_duration_seconds", "kind", kind, "location", loc.name, "phase", "Completed")
			g.Expect(n).To(Equal(1.0), "operation durations observed")
			g.Expect(sum).To(BeNumerically("~", took, 1), "the operation's duration, creation to completion")
			n, _, _ = sample(families, "kubevirt_datamover_transfer_duration_seconds", "kind", kind, "location", loc.name)
			g.Expect(n).To(Equal(1.0), "transfer durations observed")
			_, _, found = sample(families, "kubevirt_datamover_operations_in_progress", "kind", kind, "location", loc.name, "phase", "Accepted")
			g.Expect(found).To(BeFalse(), "no longer in progress")
		}).Should(Succeed())
	})
})
