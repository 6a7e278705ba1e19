package framework

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
)

// Require skips the current spec when a piece of infrastructure could not
// start, naming it; in CI (CI=true) it fails instead, since a CI run that
// skips proves nothing.
func Require(err error, what string) {
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s could not start: %v", what, err)
	if InCI() {
		Fail(msg, 1)
	}
	Skip(msg, 1)
}
