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

// Command testdiff compares two runs of the same unit tests, pristine and
// patched, and fails when the patched run loses a test the pristine run
// passed, or fails a test the pristine run did not have.
//
// Each argument is a directory of results: `go test -json` streams (*.json)
// and Ginkgo JSON reports (*.ginkgo.json), so Ginkgo specs count one by one
// rather than as one Go test per suite.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type outcome string

const (
	passed  outcome = "passed"
	failed  outcome = "failed"
	skipped outcome = "skipped"
)

// results maps "package: test" to its outcome.
type results map[string]outcome

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: testdiff PRISTINE_DIR PATCHED_DIR")
		os.Exit(2)
	}
	pristine, err := load(os.Args[1])
	if err == nil {
		var patched results
		if patched, err = load(os.Args[2]); err == nil {
			os.Exit(report(pristine, patched))
		}
	}
	fmt.Fprintln(os.Stderr, "testdiff:", err)
	os.Exit(2)
}

func load(dir string) (results, error) {
	r := results{}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".ginkgo.json") {
			err = loadGinkgo(f, r)
		} else {
			err = loadGoTest(f, r)
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
	}
	return r, nil
}

type testEvent struct {
	Action  string
	Package string
	Test    string
}

func loadGoTest(path string, r results) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev testEvent
		// Build errors and other non-JSON lines are not test results.
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "pass":
			r[ev.Package+": "+ev.Test] = passed
		case "fail":
			r[ev.Package+": "+ev.Test] = failed
		case "skip":
			r[ev.Package+": "+ev.Test] = skipped
		}
	}
	return sc.Err()
}

// ginkgoReport is what testdiff reads of a Ginkgo JSON report
// (ginkgo/v2/types.Report, whose enums encode as their names): decoded
// here so that no package under hack/ depends on Ginkgo.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
	}
}

func loadGinkgo(path string, r results) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(data, &reports); err != nil {
		return err
	}
	// The report's own SuitePath is absolute and differs between the two
	// trees; the file is named for the package, relative to its tree.
	pkg := strings.TrimSuffix(filepath.Base(path), ".ginkgo.json")
	for _, rep := range reports {
		for _, spec := range rep.SpecReports {
			// As types.SpecReport.FullText joins them.
			texts := spec.ContainerHierarchyTexts
			if spec.LeafNodeText != "" {
				texts = append(texts, spec.LeafNodeText)
			}
			key := pkg + ": [" + spec.LeafNodeType + "] " + strings.Join(texts, " ")
			switch spec.State {
			case "passed":
				r[key] = passed
			case "failed", "timedout", "aborted", "panicked", "interrupted":
				r[key] = failed
			default:
				r[key] = skipped
			}
		}
	}
	return nil
}

func count(r results, o outcome) int {
	n := 0
	for _, v := range r {
		if v == o {
			n++
		}
	}
	return n
}

func report(pristine, patched results) int {
	var broken []string
	for name, o := range pristine {
		if o == passed && patched[name] != passed {
			broken = append(broken, fmt.Sprintf("%s: passed on pristine, %s patched", name, orMissing(patched[name])))
		}
	}
	for name, o := range patched {
		if _, ok := pristine[name]; !ok && o == failed {
			broken = append(broken, fmt.Sprintf("%s: new test fails", name))
		}
	}
	sort.Strings(broken)
	for _, b := range broken {
		fmt.Println("REGRESSION", b)
	}
	fmt.Printf("pristine: %d passed, %d failed, %d skipped\n", count(pristine, passed), count(pristine, failed), count(pristine, skipped))
	fmt.Printf("patched: %d passed, %d failed, %d skipped\n", count(patched, passed), count(patched, failed), count(patched, skipped))
	if len(broken) > 0 || count(patched, passed) == 0 {
		fmt.Printf("%d regressions\n", len(broken))
		return 1
	}
	return 0
}

func orMissing(o outcome) outcome {
	if o == "" {
		return "missing"
	}
	return o
}
