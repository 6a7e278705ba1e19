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

package logrusr_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/sirupsen/logrus"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/logging/logrusr"
)

func TestLogrusr(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "logrusr Suite")
}

var _ = Describe("New", func() {
	var (
		out  bytes.Buffer
		base *logrus.Logger
	)

	BeforeEach(func() {
		out.Reset()
		base = logrus.New()
		base.SetOutput(&out)
		base.SetFormatter(&logrus.JSONFormatter{DisableTimestamp: true})
	})

	lines := func() []map[string]any {
		var all []map[string]any
		dec := json.NewDecoder(&out)
		for dec.More() {
			var m map[string]any
			Expect(dec.Decode(&m)).To(Succeed())
			all = append(all, m)
		}
		return all
	}

	It("writes Info at Info, V(1) at Debug and errors at Error, with their values and name", func() {
		base.SetLevel(logrus.DebugLevel)
		log := logrusr.New(base.WithField("plugin", "kubevirt")).WithName("controller-runtime").WithName("client").WithValues("kind", "DataUpload")
		log.Info("warning from the API server", "code", 299)
		log.V(1).Info("detail")
		log.Error(errors.New("forbidden"), "patch", "name")
		Expect(lines()).To(Equal([]map[string]any{
			{"level": "info", "msg": "warning from the API server", "plugin": "kubevirt", "logger": "controller-runtime/client", "kind": "DataUpload", "code": float64(299)},
			{"level": "debug", "msg": "detail", "plugin": "kubevirt", "logger": "controller-runtime/client", "kind": "DataUpload"},
			{"level": "error", "msg": "patch", "plugin": "kubevirt", "logger": "controller-runtime/client", "kind": "DataUpload", "error": "forbidden", "name": "(MISSING)"},
		}))
	})

	It("asks logrus's level whether a V level is enabled", func() {
		log := logrusr.New(base)
		Expect(log.V(0).Enabled()).To(BeTrue())
		Expect(log.V(1).Enabled()).To(BeFalse())
		log.V(1).Info("hidden")
		Expect(out.String()).To(BeEmpty())
		base.SetLevel(logrus.DebugLevel)
		Expect(log.V(1).Enabled()).To(BeTrue())
	})
})
