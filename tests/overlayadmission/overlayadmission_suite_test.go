package overlayadmission_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestOverlayAdmission(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Overlay volume admission Suite")
}
