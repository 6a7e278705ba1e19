/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Package logging builds the one logger of a command of this repository.
//
// Everything here logs through github.com/go-logr/logr, the interface
// controller-runtime and client-go log through. A command builds its
// logger with New right after parsing its flags and hands it to Setup,
// once: Setup makes it the logger of controller-runtime and of klog too, so
// that what those libraries write comes out the same way, and returns the
// command's context carrying it. Libraries never build a logger or reach
// for a global one: a function takes the logger from its context
// (logr.FromContextOrDiscard), an object that outlives one call (a
// thinp.Monitor, the hook sidecar's Hook) from a logr.Logger field, whose
// zero value discards. Info and Error are for what an operator reads; V(1)
// for the detail of every step, shown with -v=1.
//
// The lines are klog's text format, as Kubernetes components write them:
//
//	I0102 15:04:05.123456   12345 hook.go:132] "overlay ready" disk="rootdisk" created=true
package logging

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Options are a command's logging settings.
type Options struct {
	// Verbosity is the highest V level written; at 0 only Info and Error
	// lines are.
	Verbosity int
	// VModule sets the verbosity of single source files, as klog's
	// -vmodule: "pattern=N,...", the pattern a file name without ".go".
	VModule string
	// Output receives the lines; nil means standard error.
	Output io.Writer
}

// AddFlags binds -v and -vmodule, klog's names, to o.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.Verbosity, "v", o.Verbosity, "log verbosity: the highest V level logged")
	fs.StringVar(&o.VModule, "vmodule", o.VModule, "log verbosity per file: pattern=N,... (file names without .go)")
}

// New builds the logger o describes.
func New(o Options) (logr.Logger, error) {
	out := o.Output
	if out == nil {
		out = os.Stderr
	}
	cfg := textlogger.NewConfig(textlogger.Verbosity(o.Verbosity), textlogger.Output(out))
	if o.VModule != "" {
		if err := cfg.VModule().Set(o.VModule); err != nil {
			return logr.Logger{}, fmt.Errorf("log verbosity per file %q: %w", o.VModule, err)
		}
	}
	return textlogger.NewLogger(cfg), nil
}

// Setup makes log the logger of controller-runtime and of klog (which
// client-go writes through) and returns ctx carrying it, for the libraries
// the command calls. A command calls it once, before anything logs:
// controller-runtime prints a warning when something logs through it and
// no logger was ever set.
func Setup(ctx context.Context, log logr.Logger) context.Context {
	ctrllog.SetLogger(log)
	opts := []klog.LoggerOption{klog.ContextualLogger(true)}
	if w, ok := log.GetSink().(textlogger.KlogBufferWriter); ok {
		// klog's own lines keep the header klog gives them.
		opts = append(opts, klog.WriteKlogBuffer(w.WriteKlogBuffer))
	}
	klog.SetLoggerWithOptions(log, opts...)
	return logr.NewContext(ctx, log)
}
