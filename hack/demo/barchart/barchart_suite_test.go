package barchart_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestBarchart(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "barchart Suite")
}
