// Package thinp_test is the functional suite of thin provisioning: the
// test guest writes into a qcow2 overlay formatted onto a small loop
// device while a thinp.Monitor grows the device under it.
package thinp_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/thinp/testbed"
)

func TestThinp(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "thinp functional Suite")
}

var env *testbed.Env

var _ = BeforeSuite(func(ctx context.Context) {
	env = testbed.StartEnv(ctx)
}, NodeTimeout(2*time.Minute))
