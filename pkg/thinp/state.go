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

package thinp

import "fmt"

// State is where one disk stands between two extensions. See the package
// documentation for the transitions.
type State int

const (
	// StateUnarmed means no threshold is set on the disk's node.
	StateUnarmed State = iota
	// StateArmed means a threshold is set; free space is above it.
	StateArmed
	// StateExceeded means the guest's writes crossed the threshold (or filled
	// the device); the disk waits for an extension.
	StateExceeded
	// StateExtending means an Extender is growing the device.
	StateExtending
	// StateAtMaximum means the device can hold the fully allocated image; the
	// disk is no longer watched.
	StateAtMaximum
)

func (s State) String() string {
	switch s {
	case StateUnarmed:
		return "unarmed"
	case StateArmed:
		return "armed"
	case StateExceeded:
		return "exceeded"
	case StateExtending:
		return "extending"
	case StateAtMaximum:
		return "at-maximum"
	default:
		return fmt.Sprintf("State(%d)", int(s))
	}
}

// allowed lists the transitions of the state machine.
var allowed = map[State][]State{
	StateUnarmed:   {StateArmed, StateExceeded, StateAtMaximum},
	StateArmed:     {StateExceeded, StateUnarmed, StateAtMaximum},
	StateExceeded:  {StateExtending, StateUnarmed, StateAtMaximum},
	StateExtending: {StateUnarmed, StateExceeded, StateAtMaximum},
	StateAtMaximum: {},
}

// CanTransition reports whether a disk may move from one state to another.
func CanTransition(from, to State) bool {
	for _, s := range allowed[from] {
		if s == to {
			return true
		}
	}
	return false
}
