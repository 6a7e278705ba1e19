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

package logging_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging"
)

func TestLogging(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "logging Suite")
}

var _ = Describe("New", func() {
	It("writes Info and Error lines in klog's text format, V levels only up to the verbosity", func() {
		var out bytes.Buffer
		log, err := logging.New(logging.Options{Output: &out})
		Expect(err).NotTo(HaveOccurred())
		log.Info("overlay ready", "disk", "rootdisk", "created", true)
		log.V(1).Info("state", "from", "Armed")
		log.Error(errors.New("no space"), "extend", "disk", "vda")
		Expect(out.String()).To(MatchRegexp(`^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ logging_test\.go:\d+\] "overlay ready" disk="rootdisk" created=true
E\d{4} [^\]]+\] "extend" err="no space" disk="vda"
$`))
	})

	It("writes V levels up to the verbosity, per file with VModule", func() {
		var out bytes.Buffer
		log, err := logging.New(logging.Options{Output: &out, Verbosity: 1})
		Expect(err).NotTo(HaveOccurred())
		log.V(1).Info("one")
		log.V(2).Info("two")
		Expect(out.String()).To(ContainSubstring(`"one"`))
		Expect(out.String()).NotTo(ContainSubstring(`"two"`))

		out.Reset()
		log, err = logging.New(logging.Options{Output: &out, VModule: "logging_test=2"})
		Expect(err).NotTo(HaveOccurred())
		log.V(2).Info("two")
		Expect(out.String()).To(ContainSubstring(`"two"`))
	})

	It("refuses a malformed VModule", func() {
		_, err := logging.New(logging.Options{VModule: "logging_test"})
		Expect(err).To(MatchError(ContainSubstring("log verbosity per file")))
	})

	It("takes -v and -vmodule from the command line", func() {
		var o logging.Options
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		o.AddFlags(fs)
		Expect(fs.Parse([]string{"-v=3", "-vmodule=hook=4"})).To(Succeed())
		Expect(o).To(Equal(logging.Options{Verbosity: 3, VModule: "hook=4"}))
	})
})

var _ = Describe("Setup", func() {
	It("makes the logger controller-runtime's, klog's and the context's", func() {
		var out bytes.Buffer
		log, err := logging.New(logging.Options{Output: &out})
		Expect(err).NotTo(HaveOccurred())
		ctx := logging.Setup(context.Background(), log)
		DeferCleanup(klog.ClearLogger)

		logr.FromContextOrDiscard(ctx).Info("from the context")
		ctrllog.Log.WithName("manager").Info("from controller-runtime")
		klog.InfoS("from klog", "pod", "p")
		klog.Infof("from klog, formatted %d", 1)
		klog.Flush()
		Expect(out.String()).To(MatchRegexp(`(?m)^I.*\] "from the context"$`))
		Expect(out.String()).To(MatchRegexp(`(?m)^I.*\] "from controller-runtime" logger="manager"$`))
		Expect(out.String()).To(MatchRegexp(`(?m)^I.*\] "from klog" pod="p"$`))
		Expect(out.String()).To(MatchRegexp(`(?m)^I.*\] from klog, formatted 1$`))
	})
})
