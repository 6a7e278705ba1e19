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
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/qcow2meta"
)

// layer is what a layer of a chain holds and how large its disk is.
type layer struct {
	size    int64
	extents []qcow2meta.Extent
}

func data(guest, host, length int64) qcow2meta.Extent {
	return qcow2meta.Extent{Guest: guest, Host: host, Length: length}
}

func zero(guest, length int64) qcow2meta.Extent {
	return qcow2meta.Extent{Guest: guest, Length: length}
}

var _ = DescribeTable("chainPlanner gives each guest range to the topmost layer that holds it",
	// layers and want are base first; the planner takes them top first.
	func(layers []layer, want [][]qcow2meta.Extent, wantZero []span) {
		top := layers[len(layers)-1]
		p := newChainPlanner(top.size)
		got := make([][]qcow2meta.Extent, len(layers))
		for i := len(layers) - 1; i >= 0; i-- {
			got[i] = p.claim(layers[i].extents, layers[i].size)
		}
		Expect(got).To(Equal(want))
		Expect(p.zeroes()).To(Equal(wantZero))
	},
	Entry("a base alone: what it does not hold is zeroes",
		[]layer{{100, []qcow2meta.Extent{data(0, 1000, 10), zero(20, 10), data(40, 3000, 10)}}},
		[][]qcow2meta.Extent{{data(0, 1000, 10), data(40, 3000, 10)}},
		[]span{{10, 40}, {50, 100}}),
	Entry("an incremental over a full disk: data and zeroes hide the base's",
		[]layer{
			{100, []qcow2meta.Extent{data(0, 1000, 100)}},
			{100, []qcow2meta.Extent{data(10, 5000, 10), zero(50, 10)}},
		},
		[][]qcow2meta.Extent{
			{data(0, 1000, 10), data(20, 1020, 30), data(60, 1060, 40)},
			{data(10, 5000, 10)},
		},
		[]span{{50, 60}}),
	Entry("three layers of overlapping writes",
		[]layer{
			{100, []qcow2meta.Extent{data(0, 1000, 40), data(60, 2000, 40)}},
			{100, []qcow2meta.Extent{data(30, 4000, 40)}},
			{100, []qcow2meta.Extent{data(35, 6000, 5), data(65, 7000, 30)}},
		},
		[][]qcow2meta.Extent{
			{data(0, 1000, 30), data(95, 2035, 5)},
			{data(30, 4000, 5), data(40, 4010, 25)},
			{data(35, 6000, 5), data(65, 7000, 30)},
		},
		[]span(nil)),
	Entry("a layer whose extent spans several of the layers above",
		[]layer{
			{100, []qcow2meta.Extent{data(0, 1000, 100)}},
			{100, []qcow2meta.Extent{data(10, 5000, 10), zero(30, 10)}},
			{100, []qcow2meta.Extent{data(15, 6000, 10), data(60, 7000, 10)}},
		},
		[][]qcow2meta.Extent{
			{data(0, 1000, 10), data(25, 1025, 5), data(40, 1040, 20), data(70, 1070, 30)},
			{data(10, 5000, 5)},
			{data(15, 6000, 10), data(60, 7000, 10)},
		},
		[]span{{30, 40}}),
	Entry("a disk grown after its full backup: zeroes past the base's end",
		[]layer{
			{50, []qcow2meta.Extent{data(0, 1000, 50)}},
			{100, []qcow2meta.Extent{data(80, 2000, 10)}},
		},
		[][]qcow2meta.Extent{{data(0, 1000, 50)}, {data(80, 2000, 10)}},
		[]span{{50, 80}, {90, 100}}),
	Entry("a disk shrunk, then grown: zeroes past the smaller layer's end",
		[]layer{
			{100, []qcow2meta.Extent{data(0, 1000, 100)}},
			{40, nil},
			{100, []qcow2meta.Extent{zero(90, 10)}},
		},
		[][]qcow2meta.Extent{{data(0, 1000, 40)}, nil, nil},
		[]span{{40, 100}}),
	Entry("a disk shrunk: nothing past the top's end",
		[]layer{
			{100, []qcow2meta.Extent{data(0, 1000, 100)}},
			{60, []qcow2meta.Extent{data(50, 3000, 10)}},
		},
		[][]qcow2meta.Extent{{data(0, 1000, 50)}, {data(50, 3000, 10)}},
		[]span(nil)),
	Entry("nothing held at all",
		[]layer{{100, nil}, {100, nil}},
		[][]qcow2meta.Extent{nil, nil},
		[]span{{0, 100}}),
)
