package overlaydemo

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestOverlaydemo(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "overlaydemo Suite")
}
