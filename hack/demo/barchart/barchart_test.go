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

package barchart_test

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/hack/demo/barchart"
)

const mib = 1 << 20

var (
	blue   = color.RGBA{0x00, 0x72, 0xb2, 0xff}
	orange = color.RGBA{0xe6, 0x9f, 0x00, 0xff}
)

// bars lists the heights of the bars of colour c, left to right: runs of
// columns holding c below the title and legend.
func bars(img image.Image, c color.RGBA) []int {
	const belowLegend = 45
	var heights []int
	inBar := false
	for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
		n := 0
		for y := belowLegend; y < img.Bounds().Max.Y; y++ {
			if img.At(x, y) == c {
				n++
			}
		}
		if n > 0 && !inBar {
			heights = append(heights, n)
		}
		inBar = n > 0
	}
	return heights
}

var _ = Describe("Chart", func() {
	chart := barchart.Chart{
		Title:  "allocated bytes per disk",
		Labels: []string{"golden", "vm-a"},
		Series: []barchart.Series{
			{Name: "first boot", Values: []int64{96 * mib, 24 * mib}},
			{Name: "after restart", Values: []int64{96 * mib, 48 * mib}},
		},
	}

	It("writes a PNG whose bars are proportional to the values", func() {
		path := filepath.Join(GinkgoT().TempDir(), "chart.png")
		Expect(chart.WritePNG(path)).To(Succeed())
		f, err := os.Open(path)
		Expect(err).ToNot(HaveOccurred())
		defer f.Close()
		img, err := png.Decode(f)
		Expect(err).ToNot(HaveOccurred())
		Expect(img.Bounds().Dx()).To(BeNumerically(">=", 400))

		first, after := bars(img, blue), bars(img, orange)
		Expect(first).To(HaveLen(2))
		Expect(after).To(HaveLen(2))
		Expect(after[0]).To(Equal(first[0]))
		Expect(float64(first[1]) / float64(first[0])).To(BeNumerically("~", 0.25, 0.02))
		Expect(float64(after[1]) / float64(first[0])).To(BeNumerically("~", 0.5, 0.02))
	})

	It("draws a zero as a visible line, not as nothing", func() {
		zero := barchart.Chart{Title: "t", Labels: []string{"a"}, Series: []barchart.Series{{Name: "s", Values: []int64{0}}}}
		img, err := zero.Render()
		Expect(err).ToNot(HaveOccurred())
		Expect(bars(img, blue)).To(Equal([]int{1}))
	})

	DescribeTable("refuses what it cannot draw, saying why",
		func(c barchart.Chart, want string) {
			_, err := c.Render()
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("no labels", barchart.Chart{Series: []barchart.Series{{Name: "s"}}}, "at least one label"),
		Entry("values missing", barchart.Chart{Labels: []string{"a", "b"}, Series: []barchart.Series{{Name: "s", Values: []int64{1}}}},
			`series "s" has 1 values for 2 labels`),
		Entry("a negative value", barchart.Chart{Labels: []string{"a"}, Series: []barchart.Series{{Name: "s", Values: []int64{-1}}}},
			`series "s" has a negative value -1`),
		Entry("too many series", barchart.Chart{Labels: []string{"a"}, Series: []barchart.Series{
			{Name: "1", Values: []int64{1}}, {Name: "2", Values: []int64{1}}, {Name: "3", Values: []int64{1}},
			{Name: "4", Values: []int64{1}}, {Name: "5", Values: []int64{1}}}}, "5 series, at most 4"),
	)
})
