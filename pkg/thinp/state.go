package thinp

import "fmt"

// State is where one disk stands between two extensions. See the package
// documentation for the transitions.
type State int

const (
	// StateUnarmed: no threshold is set on the disk's node.
	StateUnarmed State = iota
	// StateArmed: a threshold is set; free space is above it.
	StateArmed
	// StateExceeded: the guest's writes crossed the threshold (or filled
	// the device); the disk waits for an extension.
	StateExceeded
	// StateExtending: an Extender is growing the device.
	StateExtending
	// StateAtMaximum: the device can hold the fully allocated image; the
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
