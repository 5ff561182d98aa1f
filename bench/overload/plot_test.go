package overload

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotSeries is one contender's figures, by load.
type plotSeries struct {
	name string
	figs []figure
}

// writePlot draws goodput, critical-tier goodput and p99 against offered
// load, one line per contender, in three panels and a legend, to a PNG
// file at path.
func writePlot(path string, c config, series []plotSeries) error {
	panels := []struct {
		title, y string
		value    func(figure) float64
		ymax     float64
	}{
		{"Goodput", "answers within the deadline / capacity", func(f figure) float64 { return f.goodput }, 1.1},
		{"Critical-tier goodput (20% of the load)", "critical answers in time / capacity", func(f figure) float64 { return f.critical }, 1.1},
		{"p99 latency of admitted requests", "ms (a late answer counts as the 1 s deadline)", func(f figure) float64 { return float64(f.p99.Milliseconds()) }, 1050},
	}
	legend := plot.New()
	legend.HideAxes()
	legend.Legend.Top = true
	legend.Legend.Left = true
	legend.Legend.TextStyle.Font.Size = vg.Points(11)
	legend.Title.Text = fmt.Sprintf("%d workers, lognormal service mean %v: capacity %.0f/s; deadline %v; seeded Poisson arrivals, virtual time",
		c.workers, c.service, c.capacity(), c.deadline)
	legend.Title.TextStyle.Font.Size = vg.Points(9)
	var plots []*plot.Plot
	for pi, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.X.Label.Text = "offered load (× capacity)"
		p.Y.Label.Text = pn.y
		p.X.Scale = plot.LogScale{}
		ticks := make(plot.ConstantTicks, len(loads))
		for i, l := range loads {
			ticks[i] = plot.Tick{Value: l, Label: fmt.Sprint(l)}
		}
		p.X.Tick.Marker = ticks
		p.X.Min, p.X.Max = loads[0]*0.9, loads[len(loads)-1]*1.1
		p.Y.Min, p.Y.Max = 0, pn.ymax
		p.Add(plotter.NewGrid())
		if pi == 2 {
			obj := plotter.NewFunction(func(float64) float64 { return float64(sluiceObjective.Milliseconds()) })
			obj.Color = color.Gray{Y: 96}
			obj.Dashes = []vg.Length{vg.Points(2), vg.Points(4)}
			p.Add(obj)
			p.Legend.Add(fmt.Sprintf("objective p99 ≤ %v", sluiceObjective), obj)
			p.Legend.Top, p.Legend.Left = true, true
		}
		for si, s := range series {
			xys := make(plotter.XYs, len(loads))
			for i, l := range loads {
				xys[i].X, xys[i].Y = l, pn.value(s.figs[i])
			}
			line, points, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			line.Color = plotutil.Color(si)
			line.Dashes = plotutil.Dashes(si)
			line.Width = vg.Points(1.5)
			points.Color = plotutil.Color(si)
			points.Shape = plotutil.Shape(si)
			p.Add(line, points)
			if pi == 0 {
				legend.Legend.Add(s.name, line, points)
			}
		}
		plots = append(plots, p)
	}
	const w, h = 14 * vg.Inch, 10 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Millimeter * 8, PadY: vg.Millimeter * 8,
		PadTop: vg.Millimeter * 4, PadBottom: vg.Millimeter * 4, PadLeft: vg.Millimeter * 4, PadRight: vg.Millimeter * 4}
	grid := [][]*plot.Plot{{plots[0], plots[1]}, {plots[2], legend}}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			grid[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
