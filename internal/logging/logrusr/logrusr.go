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

// Package logrusr writes a logr.Logger through a logrus.FieldLogger, for
// the one process of ours handed a logrus logger it must log through:
// the Velero plugin, whose framework relays what it writes to Velero's
// log. V(0) lines go out at logrus's Info level, V(1) and above at
// Debug, errors at Error with the error under logrus's error key; names
// join with "/" under the key "logger".
package logrusr

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
)

// New returns the logger writing through l.
func New(l logrus.FieldLogger) logr.Logger {
	s := &sink{l: l, enabled: func(logrus.Level) bool { return true }}
	switch base := l.(type) {
	case *logrus.Logger:
		s.enabled = base.IsLevelEnabled
	case *logrus.Entry:
		s.enabled = base.Logger.IsLevelEnabled
	}
	return logr.New(s)
}

type sink struct {
	l       logrus.FieldLogger
	name    string
	enabled func(logrus.Level) bool
}

func (s *sink) Init(logr.RuntimeInfo) {}

func (s *sink) Enabled(level int) bool { return s.enabled(logrusLevel(level)) }

func (s *sink) Info(level int, msg string, keysAndValues ...any) {
	e := s.entry(keysAndValues)
	if logrusLevel(level) == logrus.DebugLevel {
		e.Debug(msg)
		return
	}
	e.Info(msg)
}

func (s *sink) Error(err error, msg string, keysAndValues ...any) {
	e := s.entry(keysAndValues)
	if err != nil {
		e = e.WithError(err)
	}
	e.Error(msg)
}

func (s *sink) WithValues(keysAndValues ...any) logr.LogSink {
	c := *s
	c.l = s.l.WithFields(fields(keysAndValues))
	return &c
}

func (s *sink) WithName(name string) logr.LogSink {
	c := *s
	if s.name != "" {
		name = s.name + "/" + name
	}
	c.name = name
	return &c
}

func (s *sink) entry(keysAndValues []any) logrus.FieldLogger {
	f := fields(keysAndValues)
	if s.name != "" {
		f["logger"] = s.name
	}
	return s.l.WithFields(f)
}

func logrusLevel(v int) logrus.Level {
	if v > 0 {
		return logrus.DebugLevel
	}
	return logrus.InfoLevel
}

// fields pairs logr's keys and values as logrus fields; a key without a
// value gets "(MISSING)", as logr's own sinks write it.
func fields(keysAndValues []any) logrus.Fields {
	f := make(logrus.Fields, len(keysAndValues)/2+1)
	for i := 0; i < len(keysAndValues); i += 2 {
		k, ok := keysAndValues[i].(string)
		if !ok {
			k = fmt.Sprint(keysAndValues[i])
		}
		var v any = "(MISSING)"
		if i+1 < len(keysAndValues) {
			v = keysAndValues[i+1]
		}
		f[k] = v
	}
	return f
}
