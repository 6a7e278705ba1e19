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

// Package thinp_test is the functional suite of thin provisioning: the
// test guest writes into a qcow2 overlay formatted onto a small loop
// device while a thinp.Monitor grows the device under it.
package thinp_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/thinp/testbed"
)

func TestThinp(t *testing.T) {
	framework.RunSuite(t, "thinp functional Suite")
}

var env *testbed.Env

var _ = BeforeSuite(func(ctx context.Context) {
	framework.SetupLogger()
	env = testbed.StartEnv(ctx)
}, NodeTimeout(2*time.Minute))
