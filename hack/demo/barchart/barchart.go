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

// Package barchart draws a small grouped bar chart of byte counts as a PNG,
// with the standard library's image packages and a fixed bitmap font, so
// the demo needs no plotting library.
package barchart

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Chart is one group of bars per label, one bar per series in each group.
type Chart struct {
	Title  string
	Labels []string
	Series []Series
}

// Series is a named set of values, one per label, drawn in one colour.
type Series struct {
	Name   string
	Values []int64
}

const (
	width, height = 720, 400
	// The plot area: room for the title and legend above, value-axis
	// labels left, group labels below.
	plotLeft, plotRight = 80, width - 20
	plotTop, plotBottom = 50, height - 40
	gridLines           = 4
	barGap, groupGap    = 4, 24
	// basicfont.Face7x13 is 7 pixels wide per character, 13 high.
	charWidth, lineHeight = 7, 13
	labelPad              = 4
	legendSwatch          = 10
	titleY, legendY       = 20, 38
	mib                   = 1 << 20
)

var (
	background = color.RGBA{0xff, 0xff, 0xff, 0xff}
	ink        = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grid       = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	// Colours that stay apart for colour-blind readers.
	palette = []color.RGBA{
		{0x00, 0x72, 0xb2, 0xff},
		{0xe6, 0x9f, 0x00, 0xff},
		{0x00, 0x9e, 0x73, 0xff},
		{0xcc, 0x79, 0xa7, 0xff},
	}
)

// Render draws the chart. The value axis starts at zero and ends at the
// largest value rounded up to whole grid steps of MiB.
func (c Chart) Render() (*image.RGBA, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(background), image.Point{}, draw.Src)

	top := c.axisTop()
	y := func(v int64) int {
		return plotBottom - int(float64(v)/float64(top)*float64(plotBottom-plotTop-lineHeight-labelPad))
	}
	for i := 0; i <= gridLines; i++ {
		v := top * int64(i) / gridLines
		fill(img, image.Rect(plotLeft, y(v), plotRight, y(v)+1), grid)
		text(img, plotLeft-labelPad-len(formatMiB(v))*charWidth, y(v)+lineHeight/3, formatMiB(v))
	}
	fill(img, image.Rect(plotLeft, plotBottom, plotRight, plotBottom+1), ink)

	text(img, (width-len(c.Title)*charWidth)/2, titleY, c.Title)
	legendX := plotLeft
	for s, series := range c.Series {
		fill(img, image.Rect(legendX, legendY-legendSwatch, legendX+legendSwatch, legendY), palette[s])
		text(img, legendX+legendSwatch+labelPad, legendY, series.Name)
		legendX += legendSwatch + 2*labelPad + (len(series.Name)+2)*charWidth
	}

	groupWidth := (plotRight - plotLeft - groupGap*(len(c.Labels)+1)) / len(c.Labels)
	barWidth := (groupWidth - barGap*(len(c.Series)-1)) / len(c.Series)
	for g, label := range c.Labels {
		left := plotLeft + groupGap + g*(groupWidth+groupGap)
		text(img, left+(groupWidth-len(label)*charWidth)/2, plotBottom+lineHeight+labelPad, label)
		for s, series := range c.Series {
			x := left + s*(barWidth+barGap)
			v := series.Values[g]
			// A bar is at least one pixel high: zero is drawn, not missing.
			barTop := min(y(v), plotBottom-1)
			fill(img, image.Rect(x, barTop, x+barWidth, plotBottom), palette[s])
			value := formatMiB(v)
			text(img, x+(barWidth-len(value)*charWidth)/2, barTop-labelPad, value)
		}
	}
	return img, nil
}

// WritePNG renders the chart into a PNG file.
func (c Chart) WritePNG(path string) error {
	img, err := c.Render()
	if err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
}

func (c Chart) validate() error {
	if len(c.Labels) == 0 || len(c.Series) == 0 {
		return errors.New("a chart needs at least one label and one series")
	}
	if len(c.Series) > len(palette) {
		return fmt.Errorf("%d series, at most %d can be told apart", len(c.Series), len(palette))
	}
	for _, s := range c.Series {
		if len(s.Values) != len(c.Labels) {
			return fmt.Errorf("series %q has %d values for %d labels", s.Name, len(s.Values), len(c.Labels))
		}
		for _, v := range s.Values {
			if v < 0 {
				return fmt.Errorf("series %q has a negative value %d", s.Name, v)
			}
		}
	}
	return nil
}

// axisTop is the largest value rounded up to whole MiB per grid step.
func (c Chart) axisTop() int64 {
	var largest int64
	for _, s := range c.Series {
		for _, v := range s.Values {
			largest = max(largest, v)
		}
	}
	step := int64(gridLines * mib)
	return max(step, (largest+step-1)/step*step)
}

// formatMiB shows bytes in MiB: whole MiB as they are, one decimal below
// 100 MiB.
func formatMiB(v int64) string {
	switch {
	case v%mib == 0:
		return fmt.Sprintf("%d MiB", v/mib)
	case v < 100*mib:
		return fmt.Sprintf("%.1f MiB", float64(v)/mib)
	default:
		return fmt.Sprintf("%d MiB", (v+mib/2)/mib)
	}
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

// text draws s with its baseline at y.
func text(img *image.RGBA, x, y int, s string) {
	d := font.Drawer{
		Dst:  img,
		Src:  image.NewUniform(ink),
		Face: basicfont.Face7x13,
		Dot:  fixed.P(x, y),
	}
	d.DrawString(s)
}
