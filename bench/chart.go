package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// series is one line of a chart.
type series struct {
	name   string
	points [][2]float64 // x, y
}

// chart is a line chart written as a standalone SVG file. It is a few dozen lines of SVG: a plotting
// library would be a dependency of the module for the benchmark's sake.
type chart struct {
	title, xLabel, yLabel string
	logX, logY            bool
	series                []series
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

const (
	chartW, chartH                  = 760, 420
	padL, padR, padT, padB, legendW = 64, 20, 36, 48, 230
)

// write renders the chart to path, creating its directory.
func (c chart) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(c.svg()), 0o644)
}

func (c chart) svg() string {
	tx, ty := identity, identity
	if c.logX {
		tx = math.Log10
	}
	if c.logY {
		ty = math.Log10
	}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for _, p := range s.points {
			minX, maxX = math.Min(minX, tx(p[0])), math.Max(maxX, tx(p[0]))
			minY, maxY = math.Min(minY, ty(p[1])), math.Max(maxY, ty(p[1]))
		}
	}
	if math.IsInf(minX, 1) {
		minX, maxX, minY, maxY = 0, 1, 0, 1
	}
	if c.logY {
		minY, maxY = math.Floor(minY), math.Ceil(maxY)
	} else {
		minY = math.Min(minY, 0)
	}
	if maxX == minX {
		maxX++
	}
	if maxY == minY {
		maxY++
	}
	plotW, plotH := float64(chartW-padL-padR-legendW), float64(chartH-padT-padB)
	px := func(x float64) float64 { return padL + (tx(x)-minX)/(maxX-minX)*plotW }
	py := func(y float64) float64 { return padT + plotH - (ty(y)-minY)/(maxY-minY)*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(c.title))
	// Axes and grid.
	fmt.Fprintf(&b, `<g stroke="#ccc">`)
	for _, v := range c.ticks(minY, maxY, c.logY) {
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f"/>`, padL, y, padL+plotW, y)
	}
	fmt.Fprintf(&b, "</g>\n")
	for _, v := range c.ticks(minY, maxY, c.logY) {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, py(v)+4, label(v))
	}
	xs := map[float64]bool{}
	for _, s := range c.series {
		for _, p := range s.points {
			if !xs[p[0]] {
				xs[p[0]] = true
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(p[0]), padT+plotH+16, label(p[0]))
			}
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="black"/>`+"\n", padL, padT, padL, padT+plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, chartH-10, html.EscapeString(c.xLabel))
	if c.yLabel != "" {
		fmt.Fprintf(&b, `<text x="14" y="%.1f" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>`+"\n", padT+plotH/2, padT+plotH/2, html.EscapeString(c.yLabel))
	}
	// Lines, points and the legend.
	for i, s := range c.series {
		color := palette[i%len(palette)]
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		dash := ""
		if strings.HasPrefix(s.name, "floor") {
			dash = ` stroke-dasharray="5,4"`
		}
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
			for _, p := range pts {
				x, y, _ := strings.Cut(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", x, y, color)
			}
		}
		ly := padT + 10 + i*20
		lx := chartW - legendW + 10
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, lx, ly, lx+24, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", lx+30, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// ticks are the y-axis grid values: powers of ten (and 2x, 5x when few) on a log axis, five steps
// on a linear one. lo and hi are in axis units (log10 on a log axis).
func (c chart) ticks(lo, hi float64, logAxis bool) []float64 {
	var out []float64
	if logAxis {
		for e := lo; e <= hi+1e-9; e++ {
			out = append(out, math.Pow(10, e))
			if hi-lo <= 2 && e < hi {
				out = append(out, 2*math.Pow(10, e), 5*math.Pow(10, e))
			}
		}
		return out
	}
	for i := 0; i <= 5; i++ {
		out = append(out, lo+(hi-lo)*float64(i)/5)
	}
	return out
}

func identity(x float64) float64 { return x }

// label prints a tick value briefly: 30000 → 30k, 0.5 → 0.5.
func label(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
