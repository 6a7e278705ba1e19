package thinp_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestThinp(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "thinp Suite")
}
