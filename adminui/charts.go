package adminui

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts are SVG drawn on the server: no script, nothing from
// elsewhere, and a page that reads the same with scripts off.
const chartWidth, chartHeight = 600.0, 100.0

// chartView is one series as a page draws it.
type chartView struct {
	Name, Title string
	// Segments are polylines' points ("x,y x,y …"): a gap in the
	// readings (a failed sample, a restart) breaks the line.
	Segments []string
	// Points counts the readings drawn; Max labels the top of the scale,
	// Last the latest reading, Span how far back the chart goes.
	Points          int
	Max, Last, Span string
}

var chartTitles = map[string]string{
	seriesSent:        "Sent per second",
	seriesFinished:    "Finished per second (estimate)",
	seriesBacklog:     "Backlog (messages)",
	seriesLag:         "Lag (seconds)",
	seriesRetrying:    "Waiting for a retry",
	seriesDeadLetters: "Dead letters",
}

// charts draws a topic's or group's series over the history's span,
// ending at its latest sample. Nil when there is no history.
func (u *ui) charts(topic, group string) []chartView {
	h := u.cfg.History
	if h == nil {
		return nil
	}
	series := h.Of(topic, group)
	var end time.Time
	for _, s := range series {
		if n := len(s.Points); n > 0 && s.Points[n-1].At.After(end) {
			end = s.Points[n-1].At
		}
	}
	span, gap := h.cfg.Span, 2*h.cfg.Every
	out := make([]chartView, 0, len(series))
	for _, s := range series {
		c := chartView{Name: s.Name, Title: chartTitles[s.Name], Points: len(s.Points), Span: roundSpan(span), Last: "–", Max: "0"}
		top := 0.0
		for _, p := range s.Points {
			top = max(top, p.Value)
		}
		if len(s.Points) > 0 {
			c.Last = figure(s.Points[len(s.Points)-1].Value)
			c.Max = figure(top)
		}
		top = max(top*1.1, 1)
		var seg [][2]float64
		for i, p := range s.Points {
			if i > 0 && p.At.Sub(s.Points[i-1].At) > gap {
				c.Segments, seg = append(c.Segments, line(seg)), nil
			}
			seg = append(seg, [2]float64{chartWidth * (1 - end.Sub(p.At).Seconds()/span.Seconds()), chartHeight * (1 - p.Value/top)})
		}
		if len(seg) > 0 {
			c.Segments = append(c.Segments, line(seg))
		}
		out = append(out, c)
	}
	return out
}

// line writes a segment's points as a polyline's; a lone point becomes a
// short dash so it shows.
func line(points [][2]float64) string {
	if len(points) == 1 {
		p := points[0]
		points = [][2]float64{{max(0, p[0]-3), p[1]}, p}
	}
	out := make([]string, len(points))
	for i, p := range points {
		out[i] = fmt.Sprintf("%.1f,%.1f", p[0], p[1])
	}
	return strings.Join(out, " ")
}

// figure writes a reading shortly: whole numbers as they are, others
// with two significant decimals.
func figure(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	if math.Abs(v) >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// roundSpan writes a span without its zero parts ("1h", "15m", "90s").
func roundSpan(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return age(d)
}
