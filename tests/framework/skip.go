package framework

import (
	"context"
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

// StartSuiteLibvirtd starts a private libvirtd for an Ordered container
// (call it from BeforeAll): skipped, or failed in CI, when it cannot start,
// and stopped when the container's specs are done.
func StartSuiteLibvirtd(ctx context.Context) *Libvirtd {
	lv, err := StartLibvirtd(ctx)
	Require(err, "libvirtd")
	DeferCleanup(func(ctx SpecContext) error { return lv.Stop(ctx) })
	return lv
}
