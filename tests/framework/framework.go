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

// Package framework adapts internal/testenv to the Ginkgo suites under
// tests/: what cannot start skips the spec, or fails it in CI, and what
// starts is stopped when the specs are done.
package framework

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// EventuallyTimeout is how long an Eventually without a timeout or context
// of its own waits. Gomega's default, one second, is a wall-clock bound:
// a real libvirtd, API server or guest on a loaded machine misses it now
// and then, and the spec fails for no fault of the code. A condition that
// holds returns at once, so a long bound costs nothing when all is well.
const EventuallyTimeout = 2 * time.Minute

// RunSuite runs a package's specs, Gomega failing through Ginkgo and
// waiting up to EventuallyTimeout.
func RunSuite(t *testing.T, description string) {
	gomega.RegisterFailHandler(ginkgo.Fail)
	gomega.SetDefaultEventuallyTimeout(EventuallyTimeout)
	ginkgo.RunSpecs(t, description)
}

// At its end every suite prints each spec it ran with its state, time and
// labels, so that a CI log says which spec took how long, whatever the
// verbosity, and which guest or infrastructure it used; then why each
// failed spec failed.
var _ = ginkgo.ReportAfterSuite("spec times", func(r ginkgo.Report) {
	fmt.Printf("\n%s: spec times\n", r.SuiteDescription)
	for _, spec := range r.SpecReports {
		// Specs the label filter left out are skipped without a reason.
		if spec.LeafNodeType != types.NodeTypeIt || spec.State == types.SpecStateSkipped && spec.Failure.Message == "" {
			continue
		}
		labels := ""
		if len(spec.Labels()) > 0 {
			labels = " [" + strings.Join(spec.Labels(), ", ") + "]"
		}
		fmt.Printf("%7.1f s  %-8s %s%s\n", spec.RunTime.Seconds(), spec.State, spec.FullText(), labels)
	}
	// Last, one line for each failure: a CI log kept only by its tail
	// still says why.
	for _, spec := range r.SpecReports {
		if spec.Failed() {
			fmt.Printf("why %q failed: %s\n", spec.FullText(), oneLine(spec.Failure.Message, 300, 700))
		}
	}
})

// oneLine folds a message into one line, keeping its first head and last
// tail characters when it is longer.
func oneLine(message string, head, tail int) string {
	s := []rune(strings.Join(strings.Fields(message), " "))
	if len(s) <= head+tail {
		return string(s)
	}
	return string(s[:head]) + " … " + string(s[len(s)-tail:])
}

// InCI reports whether the run is CI's, where nothing may be skipped.
func InCI() bool {
	return os.Getenv("CI") == "true"
}

// SetupLogger makes GinkgoLogr the logger of controller-runtime and klog,
// so that what envtest, the API client and the controllers a suite runs
// log goes with the spec's output (shown on failure or with -v), and
// controller-runtime does not warn that no logger was set. A suite calls
// it once, first in its BeforeSuite.
func SetupLogger() {
	logging.Setup(context.Background(), ginkgo.GinkgoLogr)
}

// Require skips the current spec when a piece of infrastructure could not
// start, naming it; in CI (CI=true) it fails instead, since a CI run that
// skips proves nothing.
func Require(err error, what string) {
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s could not start: %v", what, err)
	if InCI() {
		ginkgo.Fail(msg, 1)
	}
	ginkgo.Skip(msg, 1)
}

// StartSuiteLibvirtd starts a private libvirtd for an Ordered container
// (call it from BeforeAll): skipped, or failed in CI, when it cannot start,
// and stopped when the container's specs are done.
func StartSuiteLibvirtd(ctx context.Context) *testenv.Libvirtd {
	lv, err := testenv.StartLibvirtd(ctx)
	Require(err, "libvirtd")
	ginkgo.DeferCleanup(func(ctx ginkgo.SpecContext) error { return lv.Stop(ctx) })
	return lv
}

// EveryTick runs step every interval until ctx ends, logging its errors
// under name: the loop of a stand-in that plays a controller in a spec.
func EveryTick(ctx context.Context, name string, interval time.Duration, step func(context.Context) error) {
	defer ginkgo.GinkgoRecover()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := step(ctx); err != nil && ctx.Err() == nil {
			ginkgo.GinkgoWriter.Printf("%s: %v\n", name, err)
		}
	}
}
