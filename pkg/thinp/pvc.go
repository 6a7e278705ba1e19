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
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// DefaultPVCPollInterval is how often a PVCExtender reads the claim while
// waiting for its capacity.
const DefaultPVCPollInterval = 500 * time.Millisecond

// PVCExtender grows a Kubernetes PersistentVolumeClaim: it raises the
// claim's storage request and waits until the claim's status reports the
// capacity, which the storage driver sets once the volume has grown. The
// claim's StorageClass must allow volume expansion.
type PVCExtender struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// PollInterval is how often the claim is read while waiting; 0 means
	// DefaultPVCPollInterval.
	PollInterval time.Duration
}

// Extend requests size bytes for the claim (unless it requests as much
// already) and waits until its capacity is at least size.
func (p *PVCExtender) Extend(ctx context.Context, size int64) (int64, error) {
	claims := p.Client.CoreV1().PersistentVolumeClaims(p.Namespace)
	claim, err := claims.Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("extend claim %s/%s: %w", p.Namespace, p.Name, err)
	}
	want := resource.NewQuantity(size, resource.BinarySI)
	if req, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || req.Cmp(*want) < 0 {
		patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, want.String())
		if _, err := claims.Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return 0, fmt.Errorf("extend claim %s/%s to %s: %w", p.Namespace, p.Name, want, err)
		}
	}
	interval := p.PollInterval
	if interval == 0 {
		interval = DefaultPVCPollInterval
	}
	var capacity int64
	err = wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		claim, err := claims.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got, ok := claim.Status.Capacity[corev1.ResourceStorage]
		if !ok {
			return false, nil
		}
		capacity = got.Value()
		return capacity >= size, nil
	})
	if err != nil {
		return 0, fmt.Errorf("extend claim %s/%s to %s: wait for capacity (now %d bytes): %w", p.Namespace, p.Name, want, capacity, err)
	}
	return capacity, nil
}
