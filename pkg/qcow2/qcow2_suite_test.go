package qcow2_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestQcow2(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "qcow2 Suite")
}
