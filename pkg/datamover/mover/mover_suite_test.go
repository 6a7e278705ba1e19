package mover_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestMover(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "mover Suite")
}
