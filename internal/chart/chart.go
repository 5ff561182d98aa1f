// Package chart draws line charts as PNG images, with the standard
// library's image packages and a bitmap font: enough for a command to
// show a rate over time without a plotting dependency.
//
// A Chart is a value; WritePNG draws it and keeps no state, so one Chart
// may be drawn from several goroutines.
package chart

import (
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A Series is one line: Y[i] is its value at X0 + i·Step of its Chart.
type Series struct {
	Name  string
	Color color.Color
	Y     []float64
}

// A Chart is a set of lines over a common x axis.
type Chart struct {
	Title, XLabel, YLabel string
	// X0 and Step place the points: point i of every series is at
	// X0 + i·Step. Step 0 means 1.
	X0, Step float64
	Series   []Series
	// Width and Height are the image's, in pixels; 0 means 900 × 480.
	Width, Height int
}

// Limits of a chart's size, so that a mistaken figure cannot ask for a
// huge image.
const (
	maxSide   = 4000
	maxPoints = 1 << 20
)

// WritePNG draws c as a PNG image to w.
func (c Chart) WritePNG(w io.Writer) error {
	img, err := c.Draw()
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Palette is the colours given, in turn, to series without one.
var Palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	color.RGBA{0x94, 0x67, 0xbd, 0xff},
}

// Draw returns c as an image.
func (c Chart) Draw() (*image.RGBA, error) {
	wd, ht := orInt(c.Width, 900), orInt(c.Height, 480)
	if wd < 200 || ht < 150 || wd > maxSide || ht > maxSide {
		return nil, fmt.Errorf("chart: size %d×%d outside 200×150 to %d×%d", wd, ht, maxSide, maxSide)
	}
	step := c.Step
	if step == 0 {
		step = 1
	}
	if step < 0 || math.IsNaN(step) || math.IsInf(step, 0) || math.IsNaN(c.X0) || math.IsInf(c.X0, 0) {
		return nil, errors.New("chart: X0 and Step must be finite, Step positive")
	}
	n, ymax := 0, 0.0
	for _, s := range c.Series {
		n = max(n, len(s.Y))
		for _, y := range s.Y {
			if math.IsNaN(y) || math.IsInf(y, 0) || y < 0 {
				return nil, fmt.Errorf("chart: series %q has a value %v; want finite values ≥ 0", s.Name, y)
			}
			ymax = max(ymax, y)
		}
	}
	if n > maxPoints {
		return nil, fmt.Errorf("chart: %d points, at most %d", n, maxPoints)
	}
	img := image.NewRGBA(image.Rect(0, 0, wd, ht))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	// The plot area.
	left, right, top, bottom := 70, wd-20, 60, ht-50
	xmax := c.X0 + float64(max(1, n-1))*step
	yticks := ticks(ymax)
	ytop := yticks[len(yticks)-1]
	px := func(x float64) int { return left + int(math.Round((x-c.X0)/(xmax-c.X0)*float64(right-left))) }
	py := func(y float64) int { return bottom - int(math.Round(y/ytop*float64(bottom-top))) }
	grid, axis, ink := color.Gray{Y: 225}, color.Gray{Y: 60}, color.Black
	for _, v := range yticks {
		y := py(v)
		hline(img, left, right, y, grid)
		label := strconv.FormatFloat(v, 'f', -1, 64)
		text(img, left-8-textWidth(label), y+4, label, ink)
	}
	for _, v := range ticks(xmax - c.X0) {
		x := px(c.X0 + v)
		vline(img, x, top, bottom, grid)
		label := strconv.FormatFloat(c.X0+v, 'f', -1, 64)
		text(img, x-textWidth(label)/2, bottom+16, label, ink)
	}
	hline(img, left, right, bottom, axis)
	vline(img, left, top, bottom, axis)
	text(img, (left+right-textWidth(c.XLabel))/2, ht-12, c.XLabel, ink)
	text(img, 8, top-8, c.YLabel, ink)
	text(img, (wd-textWidth(c.Title))/2, 18, c.Title, ink)
	// The lines, then the legend in a row under the title.
	lx := left
	for i, s := range c.Series {
		col := s.Color
		if col == nil {
			col = Palette[i%len(Palette)]
		}
		for j := 1; j < len(s.Y); j++ {
			x0, y0 := px(c.X0+float64(j-1)*step), py(s.Y[j-1])
			x1, y1 := px(c.X0+float64(j)*step), py(s.Y[j])
			line(img, x0, y0, x1, y1, col)
			line(img, x0, y0+1, x1, y1+1, col)
		}
		if len(s.Y) == 1 {
			fill(img, image.Rect(px(c.X0)-2, py(s.Y[0])-2, px(c.X0)+3, py(s.Y[0])+3), col)
		}
		fill(img, image.Rect(lx, 34, lx+20, 37), col)
		text(img, lx+26, 40, s.Name, ink)
		lx += 26 + textWidth(s.Name) + 24
	}
	return img, nil
}

// ticks returns round tick values from 0 to at least top: 4 to 10 of
// them, at a step of 1, 2 or 5 times a power of ten.
func ticks(top float64) []float64 {
	if top <= 0 {
		return []float64{0, 1}
	}
	raw := top / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := 0.0; ; v += step {
		out = append(out, v)
		if v >= top {
			return out
		}
	}
}

var face = basicfont.Face7x13

func textWidth(s string) int { return font.MeasureString(face, s).Ceil() }

func text(img draw.Image, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	fill(img, image.Rect(x0, y, x1+1, y+1), c)
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	fill(img, image.Rect(x, y0, x+1, y1+1), c)
}

// line draws a one-pixel line from (x0, y0) to (x1, y1) (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

func orInt(v, def int) int {
	if v != 0 {
		return v
	}
	return def
}
