package mover

import (
	"context"
	"fmt"
	"sync"
	"time"

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
	// Warn is told about a failed patch once; progress is best effort.
	Warn func(error)

	mu     sync.Mutex
	last   time.Time
	warned bool
}

// Func returns the ProgressFunc to hand to Upload or Restore.
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
			if s.Warn != nil {
				s.Warn(fmt.Errorf("report progress to %s: %w", client.ObjectKeyFromObject(s.Object), err))
			}
		}
	}
}
