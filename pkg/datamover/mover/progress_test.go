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

package mover_test

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/vmware-tanzu/velero/pkg/apis/velero/shared"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

var _ = Describe("StatusReporter", func() {
	var (
		c       client.Client
		du      *velerov2.DataUpload
		refused error
		logged  []string
		ctx     context.Context
	)

	BeforeEach(func() {
		scheme, err := datamover.NewScheme()
		Expect(err).NotTo(HaveOccurred())
		du = &velerov2.DataUpload{ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "nightly-db"}}
		refused = nil
		c = fake.NewClientBuilder().WithScheme(scheme).WithObjects(du.DeepCopy()).
			WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if refused != nil {
						return refused
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
			}).Build()
		logged = nil
		ctx = logr.NewContext(context.Background(), funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{}))
	})

	progress := func() *shared.DataMoveOperationProgress {
		got := &velerov2.DataUpload{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(du), got)).To(Succeed())
		return &got.Status.Progress
	}

	It("patches the progress at most once per interval, and always the last count", func() {
		report := (&mover.StatusReporter{Client: c, Object: du.DeepCopy(), Interval: time.Hour}).Func(ctx)
		report(10, 100)
		Expect(progress()).To(Equal(&shared.DataMoveOperationProgress{TotalBytes: 100, BytesDone: 10}))
		report(50, 100)
		Expect(progress().BytesDone).To(BeEquivalentTo(10))
		report(100, 100)
		Expect(progress()).To(Equal(&shared.DataMoveOperationProgress{TotalBytes: 100, BytesDone: 100}))
		Expect(logged).To(BeEmpty())
	})

	It("logs the first failed patch to the context's logger and goes on", func() {
		refused = errors.New("forbidden")
		report := (&mover.StatusReporter{Client: c, Object: du.DeepCopy(), Interval: 0}).Func(ctx)
		report(10, 100)
		report(20, 100)
		Expect(logged).To(ConsistOf(And(
			ContainSubstring(`"msg"="report progress"`),
			ContainSubstring(`"error"="forbidden"`),
			ContainSubstring(`"object"={"name"="nightly-db" "namespace"="velero"}`),
		)))
	})
})
