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

package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/retry"
)

func TestRetry(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "retry Suite")
}

var (
	errTransient = errors.New("transient")
	errFinal     = errors.New("final")
)

func transient(err error) bool { return errors.Is(err, errTransient) }

var _ = Describe("OnError", func() {
	backoff := wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 2 * time.Millisecond, Steps: 5}

	// failing returns an operation that fails with errs in turn, then
	// succeeds, and counts its calls.
	failing := func(calls *int, errs ...error) func() error {
		return func() error {
			*calls++
			if *calls <= len(errs) {
				return errs[*calls-1]
			}
			return nil
		}
	}

	It("calls again after a retriable error until the call succeeds", func() {
		calls := 0
		Expect(retry.OnError(context.Background(), backoff, transient, failing(&calls, errTransient, errTransient))).To(Succeed())
		Expect(calls).To(Equal(3))
	})

	It("returns an error the predicate refuses at once, as it is", func() {
		calls := 0
		err := retry.OnError(context.Background(), backoff, transient, failing(&calls, errTransient, errFinal))
		Expect(err).To(Equal(errFinal))
		Expect(calls).To(Equal(2))
	})

	It("makes backoff.Steps attempts, past the cap, and says so", func() {
		calls := 0
		err := retry.OnError(context.Background(), backoff, transient, failing(&calls, errTransient, errTransient, errTransient, errTransient, errTransient, errTransient))
		Expect(err).To(MatchError(errTransient))
		Expect(err).To(MatchError(ContainSubstring("after 5 attempts")))
		Expect(calls).To(Equal(5))
	})

	It("stops pausing when the context ends, keeping the last error", func() {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		err := retry.OnError(ctx, wait.Backoff{Duration: time.Hour, Steps: 3}, transient, func() error {
			calls++
			cancel()
			return errTransient
		})
		Expect(err).To(MatchError(errTransient))
		Expect(err).To(MatchError(context.Canceled))
		Expect(calls).To(Equal(1))
	})
})
