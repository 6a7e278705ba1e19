package patchcycle_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestPatchCycle(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Patch cycle Suite")
}
