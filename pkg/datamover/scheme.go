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

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// NewScheme knows the types the controllers read and write: Kubernetes',
// Velero's and KubeVirt's VirtualMachine (the backup API is unstructured).
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, velerov1.AddToScheme, velerov2.AddToScheme, kubevirtv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build the scheme: %w", err)
		}
	}
	return s, nil
}

// Setup registers both controllers with mgr, and their metrics on
// controller-runtime's registry, which the manager's metrics endpoint
// serves. Call it once per process.
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) error {
	metrics, err := NewMetrics(ctrlmetrics.Registry, mgr.GetClient())
	if err != nil {
		return err
	}
	up := &DataUploadReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorderFor("kubevirt-datamover"), Config: cfg, Metrics: metrics}
	if err := up.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	down := &DataDownloadReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Recorder: mgr.GetEventRecorderFor("kubevirt-datamover"), Config: cfg, Metrics: metrics}
	return down.SetupWithManager(mgr)
}
