package datamover

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestDatamover(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "datamover Suite")
}
