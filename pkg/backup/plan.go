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

package backup

import (
	"cmp"
	"slices"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

// span is a range of the guest's disk, [start, end).
type span struct{ start, end int64 }

// chainPlanner decides, one layer at a time from the top of a chain down
// to its base, which guest ranges the guest reads from each layer: a range
// belongs to the topmost layer that holds it, as data or as zeroes; what
// no layer holds reads as zeroes (the base has no backing file). It keeps
// ranges, not clusters, so its memory follows how scattered the layers
// are, not the disk's size.
type chainPlanner struct {
	// size is the guest's disk (the top layer's virtual size), limit the
	// smallest virtual size of the layers claimed so far: the guest reads
	// zeroes past a layer's end, whatever the layers below hold there.
	size, limit int64
	// covered is what the layers claimed so far hold, in order.
	covered []span
	// zero is what they hold as zeroes and the guest reads from them.
	zero []span
}

func newChainPlanner(size int64) *chainPlanner {
	return &chainPlanner{size: size, limit: size}
}

// claim takes the extents, in guest order, of the layer below those
// claimed so far, whose virtual size is size, and returns its data extents
// the guest reads, in guest order.
func (p *chainPlanner) claim(extents []qcow2meta.Extent, size int64) []qcow2meta.Extent {
	p.limit = min(p.limit, size)
	var data []qcow2meta.Extent
	for _, e := range subtract(extents, p.covered, p.limit) {
		if e.Zero() {
			p.zero = append(p.zero, span{e.Guest, e.Guest + e.Length})
		} else {
			data = append(data, e)
		}
	}
	p.covered = cover(p.covered, extents, p.limit)
	return data
}

// spans is how many ranges the planner keeps.
func (p *chainPlanner) spans() int { return len(p.covered) + len(p.zero) }

// zeroes returns the guest ranges that read as zeroes, in order: those a
// layer holds as zeroes and those no layer holds.
func (p *chainPlanner) zeroes() []span {
	zero := p.zero
	var at int64
	for _, c := range p.covered {
		if c.start > at {
			zero = append(zero, span{at, c.start})
		}
		at = c.end
	}
	if at < p.size {
		zero = append(zero, span{at, p.size})
	}
	slices.SortFunc(zero, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	return merge(zero)
}

// subtract returns the parts of extents, in guest order, below limit that
// covered, in order, leaves out.
func subtract(extents []qcow2meta.Extent, covered []span, limit int64) []qcow2meta.Extent {
	var out []qcow2meta.Extent
	part := func(e qcow2meta.Extent, from, to int64) {
		p := qcow2meta.Extent{Guest: from, Length: to - from}
		if !e.Zero() {
			p.Host = e.Host + from - e.Guest
		}
		out = append(out, p)
	}
	j := 0
	for _, e := range extents {
		at, end := e.Guest, min(e.Guest+e.Length, limit)
		for j < len(covered) && covered[j].end <= at {
			j++
		}
		for k := j; at < end; k++ {
			if k == len(covered) || covered[k].start >= end {
				part(e, at, end)
				break
			}
			if covered[k].start > at {
				part(e, at, covered[k].start)
			}
			at = covered[k].end
		}
	}
	return out
}

// cover returns covered, in order, with the guest ranges of extents below
// limit added, adjacent ranges merged.
func cover(covered []span, extents []qcow2meta.Extent, limit int64) []span {
	out := make([]span, 0, len(covered)+len(extents))
	i := 0
	for _, e := range extents {
		if e.Guest >= limit {
			break
		}
		for ; i < len(covered) && covered[i].start < e.Guest; i++ {
			out = append(out, covered[i])
		}
		out = append(out, span{e.Guest, min(e.Guest+e.Length, limit)})
	}
	out = append(out, covered[i:]...)
	return merge(out)
}

// merge merges the overlapping and adjacent ranges of spans, sorted by
// start, in place.
func merge(spans []span) []span {
	out := spans[:0]
	for _, s := range spans {
		if n := len(out); n > 0 && s.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, s.end)
			continue
		}
		out = append(out, s)
	}
	return out
}
