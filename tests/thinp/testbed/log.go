package testbed

import (
	"log/slog"

	. "github.com/onsi/ginkgo/v2"
)

// logger sends the Monitor's log to the spec's output, shown on failure
// or with -v.
func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(GinkgoWriter, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
