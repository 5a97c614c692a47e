// Package chart draws a timeline.Timeline as a PNG image (the demo's
// timeline.png). It is apart from internal/timeline because its plotting
// library (gonum/plot) has no place in the user's binary, which prints
// timelines as text.
package chart

import (
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"os"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/etjob/etjob/internal/timeline"
)

// PNGWidth and PNGHeight are the size SavePNG draws, in pixels.
const (
	PNGWidth  = 1200
	PNGHeight = 720
)

var (
	colorMembers = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	colorWorld   = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	colorSteps   = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	colorNotice  = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// glyphs are the marks' styles in the image, by timeline.Mark.Symbol (N notice,
// L leave, C join+leave, S suspend/stop, R resume, J join, * other); notices also get a vertical
// line through the workers panel, the moment the spot path starts.
var glyphs = map[byte]draw.GlyphStyle{
	'N': {Shape: draw.PyramidGlyph{}, Color: colorNotice, Radius: vg.Points(5)},
	'L': {Shape: draw.CrossGlyph{}, Color: color.RGBA{R: 140, G: 86, B: 75, A: 255}, Radius: vg.Points(5)},
	'C': {Shape: draw.SquareGlyph{}, Color: color.RGBA{R: 148, G: 103, B: 189, A: 255}, Radius: vg.Points(4)},
	'S': {Shape: draw.BoxGlyph{}, Color: color.RGBA{R: 227, G: 119, B: 194, A: 255}, Radius: vg.Points(4)},
	'R': {Shape: draw.CircleGlyph{}, Color: color.RGBA{R: 23, G: 190, B: 207, A: 255}, Radius: vg.Points(4)},
	'J': {Shape: draw.PlusGlyph{}, Color: colorSteps, Radius: vg.Points(5)},
	'*': {Shape: draw.RingGlyph{}, Color: color.Gray{Y: 110}, Radius: vg.Points(4)},
}

// SavePNG draws t into the file path, PNGWidth by PNGHeight pixels.
func SavePNG(path string, t timeline.Timeline) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WritePNG(f, t, PNGWidth, PNGHeight); err != nil {
		f.Close()
		return fmt.Errorf("drawing %s: %w", path, err)
	}
	return f.Close()
}

// WritePNG draws t as a PNG image of width by height pixels: the workers
// over time (members, and the ranks training when logged) with a mark per
// event, and under it, when logged, the training step on the same time axis.
func WritePNG(w io.Writer, t timeline.Timeline, width, height int) error {
	if width < 100 || height < 100 {
		return fmt.Errorf("a %dx%d image is too small for a timeline (at least 100x100)", width, height)
	}
	c := vgimg.NewWith(vgimg.UseImage(image.NewRGBA(image.Rect(0, 0, width, height))))
	dc := draw.New(c)
	workers, legend, err := workersPlot(t)
	if err != nil {
		return err
	}
	// The legend gets a strip of its own on the right: inside the panel it
	// hid the job's first minutes.
	strip := max(vg.Points(110), (dc.Max.X-dc.Min.X)/8)
	legend.Top, legend.Left, legend.YOffs = true, true, -vg.Points(24)
	legend.Draw(draw.Crop(dc, dc.Max.X-dc.Min.X-strip, 0, 0, 0))
	dc = draw.Crop(dc, 0, -strip, 0, 0)
	panels := [][]*plot.Plot{{workers}}
	if len(t.Steps) > 0 {
		steps, err := stepsPlot(t)
		if err != nil {
			return err
		}
		panels = append(panels, []*plot.Plot{steps})
	}
	pad := vg.Points(6)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: pad, PadY: pad, PadTop: pad, PadBottom: pad, PadLeft: pad, PadRight: pad}
	for i, row := range plot.Align(panels, tiles, dc) {
		panels[i][0].Draw(row[0])
	}
	_, err = vgimg.PngCanvas{Canvas: c}.WriteTo(w)
	return err
}

// minutes is x for time at: minutes since the start.
func minutes(t timeline.Timeline, at time.Time) float64 { return at.Sub(t.Start).Minutes() }

// spanMinutes is the time axis' length, never zero.
func spanMinutes(t timeline.Timeline) float64 { return math.Max(minutes(t, t.End), 1.0/60) }

// stepXYs is a series as the corners of its step line, held to End.
func stepXYs(t timeline.Timeline, s []timeline.Point) plotter.XYs {
	xys := make(plotter.XYs, 0, len(s)+1)
	for _, p := range s {
		xys = append(xys, plotter.XY{X: minutes(t, p.At), Y: float64(p.Value)})
	}
	if n := len(s); n > 0 {
		xys = append(xys, plotter.XY{X: spanMinutes(t), Y: float64(s[n-1].Value)})
	}
	return xys
}

func newPlot(t timeline.Timeline, title, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "minutes since " + t.Start.UTC().Format("2006-01-02 15:04:05") + " UTC"
	p.Y.Label.Text = yLabel
	p.X.Min, p.X.Max = 0, spanMinutes(t)
	p.Add(plotter.NewGrid())
	return p
}

// workersPlot draws the workers panel; its legend is returned apart.
func workersPlot(t timeline.Timeline) (*plot.Plot, plot.Legend, error) {
	p := newPlot(t, t.Job+": workers over time", "workers")
	top := max(1, timeline.MaxValue(t.Members), timeline.MaxValue(t.World))
	p.Y.Min, p.Y.Max = 0, float64(top)+1
	p.Y.Tick.Marker = intTicks{}
	legend := plot.NewLegend()
	legend.ThumbnailWidth = vg.Points(20)

	for _, n := range t.Events {
		if timeline.MarkOf(n.Type).Symbol != 'N' {
			continue
		}
		x := minutes(t, n.At)
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: float64(top) + 0.5}})
		if err != nil {
			return nil, legend, err
		}
		l.Color, l.Dashes, l.Width = colorNotice, []vg.Length{vg.Points(3), vg.Points(3)}, vg.Points(0.8)
		p.Add(l)
	}
	if len(t.Members) > 0 {
		l, err := plotter.NewLine(stepXYs(t, t.Members))
		if err != nil {
			return nil, legend, err
		}
		l.StepStyle, l.Color, l.Width = plotter.PostStep, colorMembers, vg.Points(2.5)
		p.Add(l)
		legend.Add("members", l)
	}
	if len(t.World) > 0 {
		l, err := plotter.NewLine(stepXYs(t, t.World))
		if err != nil {
			return nil, legend, err
		}
		l.StepStyle, l.Color, l.Width = plotter.PostStep, colorWorld, vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(l)
		legend.Add("ranks training", l)
	}
	// One scatter per kind of mark, just above the highest line, so that
	// the legend names each once.
	byMark := map[timeline.Mark]plotter.XYs{}
	for _, e := range t.Events {
		m := timeline.MarkOf(e.Type)
		byMark[m] = append(byMark[m], plotter.XY{X: minutes(t, e.At), Y: float64(top) + 0.5})
	}
	for _, m := range timeline.Marks {
		xys, ok := byMark[m]
		if !ok {
			continue
		}
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, legend, err
		}
		s.GlyphStyle = glyphs[m.Symbol]
		p.Add(s)
		legend.Add(m.Name, s)
	}
	return p, legend, nil
}

func stepsPlot(t timeline.Timeline) (*plot.Plot, error) {
	p := newPlot(t, "training step", "step")
	p.Y.Min, p.Y.Max = 0, math.Max(1, float64(timeline.MaxValue(t.Steps))*1.05)
	l, err := plotter.NewLine(stepXYs(t, t.Steps))
	if err != nil {
		return nil, err
	}
	l.StepStyle, l.Color, l.Width = plotter.PostStep, colorSteps, vg.Points(2)
	p.Add(l)
	return p, nil
}

// intTicks labels whole numbers of workers only.
type intTicks struct{}

// Ticks returns a labelled tick per whole number, or per a round stride
// for large jobs.
func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	stride := 1
	for (hi-lo)/float64(stride) > 10 {
		stride *= 2
	}
	var out []plot.Tick
	for v := int(math.Ceil(lo)); float64(v) <= hi; v++ {
		if v%stride == 0 {
			out = append(out, plot.Tick{Value: float64(v), Label: fmt.Sprint(v)})
		}
	}
	return out
}
