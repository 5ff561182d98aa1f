package chart

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"testing"
)

// TestDraw: the lines are drawn in their colours where their points are,
// the image decodes as a PNG of the size asked, and bad figures are
// refused.
func TestDraw(t *testing.T) {
	red := color.RGBA{0xff, 0, 0, 0xff}
	c := Chart{Title: "t", XLabel: "s", YLabel: "per s", Series: []Series{
		{Name: "flat", Color: red, Y: []float64{50, 50, 50, 50, 50}},
	}}
	img, err := c.Draw()
	if err != nil {
		t.Fatal(err)
	}
	// 50 of a 0–50 axis is the plot's top (y = 60); the middle of the
	// line is red, a point well below it is not.
	mid := img.Bounds().Dx() / 2
	if got := img.At(mid, 60); got != red {
		t.Errorf("at the line: %v, want red", got)
	}
	if got := img.At(mid, 200); got == red {
		t.Errorf("below the line: red")
	}
	var buf bytes.Buffer
	if err := c.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	dec, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := dec.Bounds(); b.Dx() != 900 || b.Dy() != 480 {
		t.Errorf("size %v, want 900×480", b)
	}
	for _, bad := range []Chart{
		{Width: 100},
		{Width: 1 << 20, Height: 1 << 20},
		{Step: -1},
		{Series: []Series{{Y: []float64{1, math.NaN()}}}},
		{Series: []Series{{Y: []float64{-1}}}},
		{Series: []Series{{Y: make([]float64, maxPoints+1)}}},
	} {
		if _, err := bad.Draw(); err == nil {
			t.Errorf("%+v drawn, want an error", bad.Width)
		}
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		top  float64
		want []float64
	}{
		{0, []float64{0, 1}},
		{50, []float64{0, 10, 20, 30, 40, 50}},
		{520, []float64{0, 200, 400, 600}},
		{31, []float64{0, 10, 20, 30, 40}},
	} {
		got := ticks(tc.top)
		if len(got) != len(tc.want) {
			t.Errorf("ticks(%v) = %v, want %v", tc.top, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ticks(%v) = %v, want %v", tc.top, got, tc.want)
				break
			}
		}
	}
}
