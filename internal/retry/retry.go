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

// Package retry calls an operation again, after a pause, while its error is
// worth it: client-go's retry.OnError with a context that also ends the
// pauses.
package retry

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/wait"
)

// OnError calls fn until it succeeds, fails with an error that retriable
// refuses, or has been called backoff.Steps times (at least once), pausing
// between calls as backoff says. Unlike wait.ExponentialBackoff, a pause
// that reaches backoff.Cap stays there rather than ending the attempts.
//
// It returns nil or fn's last error: as it is when retriable refused it,
// marked with the number of attempts when they ran out, and with ctx's
// error when ctx ended during a pause.
func OnError(ctx context.Context, backoff wait.Backoff, retriable func(error) bool, fn func() error) error {
	var last, final error
	attempts := 0
	err := backoff.DelayFunc().Until(ctx, true, true, func(context.Context) (bool, error) {
		attempts++
		last = fn()
		switch {
		case last == nil || !retriable(last):
			final = last
		case attempts >= backoff.Steps:
			final = fmt.Errorf("%w (after %d attempts)", last, attempts)
		default:
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w (retries stopped: %w)", last, err)
	}
	return final
}
