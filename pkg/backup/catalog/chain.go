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

package catalog

import (
	"fmt"
	"sort"
)

// Checkpoint returns the entry with id, or nil.
func (x *VMIndex) Checkpoint(id string) *CheckpointEntry {
	for i := range x.Checkpoints {
		if x.Checkpoints[i].ID == id {
			return &x.Checkpoints[i]
		}
	}
	return nil
}

// Latest returns the complete checkpoints, latest first: by Sequence, then
// by Timestamp for entries written without one.
func (x *VMIndex) Latest() []*CheckpointEntry {
	var out []*CheckpointEntry
	for i := range x.Checkpoints {
		if x.Checkpoints[i].IsComplete() {
			out = append(out, &x.Checkpoints[i])
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Sequence != out[j].Sequence {
			return out[i].Sequence > out[j].Sequence
		}
		return out[i].Timestamp.After(out[j].Timestamp)
	})
	return out
}

// NextSequence is the sequence number for the next completed checkpoint.
func (x *VMIndex) NextSequence() int64 {
	var highest int64
	for _, c := range x.Checkpoints {
		if c.Sequence > highest {
			highest = c.Sequence
		}
	}
	return highest + 1
}

// ChainError says why a chain of checkpoints cannot be restored.
type ChainError struct {
	VM         VM
	Checkpoint string
	Reason     string
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("checkpoint chain of %s at %s: %s", e.VM, e.Checkpoint, e.Reason)
}

// Chain returns the checkpoints that restore id, base first, after checking
// what the index alone can tell: every parent present and complete, exactly
// one full checkpoint at the base, incrementals with parents, no cycle, and
// the same set of disks in every layer.
func (x *VMIndex) Chain(id string) ([]CheckpointEntry, error) {
	vm := VM{Namespace: x.Namespace, Name: x.VMName}
	var chain []CheckpointEntry
	seen := map[string]bool{}
	for cur := id; ; {
		if seen[cur] {
			return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("parents loop through %s", cur)}
		}
		seen[cur] = true
		c := x.Checkpoint(cur)
		if c == nil {
			if cur == id {
				return nil, &ChainError{VM: vm, Checkpoint: id, Reason: "not in the index"}
			}
			return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("parent %s is not in the index", cur)}
		}
		if !c.IsComplete() {
			return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("%s is %s, not complete", cur, c.State)}
		}
		if len(c.Files) == 0 {
			return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("%s has no files", cur)}
		}
		chain = append(chain, *c)
		switch c.Type {
		case Full:
			if c.Parent != "" {
				return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("full checkpoint %s names parent %s", cur, c.Parent)}
			}
		case Incremental:
			if c.Parent == "" {
				return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("incremental checkpoint %s has no parent", cur)}
			}
			cur = c.Parent
			continue
		default:
			return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("%s has unknown type %q", cur, c.Type)}
		}
		break
	}
	// Base first.
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	disks := diskSet(chain[0])
	for _, c := range chain[1:] {
		for d := range diskSet(c) {
			if !disks[d] {
				return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("disk %s of %s is not in base %s", d, c.ID, chain[0].ID)}
			}
		}
		for d := range disks {
			if c.File(d) == nil {
				return nil, &ChainError{VM: vm, Checkpoint: id, Reason: fmt.Sprintf("%s lacks disk %s", c.ID, d)}
			}
		}
	}
	return chain, nil
}

func diskSet(c CheckpointEntry) map[string]bool {
	out := map[string]bool{}
	for _, f := range c.Files {
		out[f.DiskName] = true
	}
	return out
}

// IDs lists the checkpoint IDs of a chain in order.
func IDs(chain []CheckpointEntry) []string {
	out := make([]string, len(chain))
	for i, c := range chain {
		out[i] = c.ID
	}
	return out
}
