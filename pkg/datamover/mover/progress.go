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

package mover

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StatusReporter patches status.progress of a DataUpload or DataDownload,
// at most once per Interval, and always the final count. Velero's resources
// have no status subresource: the patch goes to the object.
type StatusReporter struct {
	Client client.Client
	// Object has the namespace and name of the resource to patch; its type
	// says which.
	Object   client.Object
	Interval time.Duration

	mu     sync.Mutex
	last   time.Time
	warned bool
}

// Func returns the ProgressFunc to hand to Upload or Restore. Progress is
// best effort: the first failed patch is logged to ctx's logger, and the
// transfer goes on.
func (s *StatusReporter) Func(ctx context.Context) ProgressFunc {
	return func(done, total int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if done < total && time.Since(s.last) < s.Interval {
			return
		}
		s.last = time.Now()
		patch := fmt.Sprintf(`{"status":{"progress":{"totalBytes":%d,"bytesDone":%d}}}`, total, done)
		if err := s.Client.Patch(ctx, s.Object, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil && !s.warned {
			s.warned = true
			logr.FromContextOrDiscard(ctx).Error(err, "report progress", "object", client.ObjectKeyFromObject(s.Object))
		}
	}
}
