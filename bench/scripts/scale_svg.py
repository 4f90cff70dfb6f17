#!/usr/bin/env python3
"""Draws W3's scale curves as an SVG (standard library only).

Reads W3 JSON lines (go run ./internal/bench -workload W3 -mode M -groups G)
on stdin and writes an SVG with one panel per system: deliveries/s against
the number of groups (log scale), with the band of +-20% around the figure
at the fewest groups. Render it to PNG with a browser, e.g.
  chromium --headless --screenshot=scale.png --window-size=900,420 scale.svg
"""
import json
import math
import sys

runs = {}
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("workload") != "W3" or "groups" not in r:
        continue
    runs.setdefault(r["system"], []).append((r["groups"], r["msgs_per_sec"]))

W, H, PAD = 440, 400, 60
out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
       % (W * max(len(runs), 1), H), '<rect width="100%" height="100%" fill="white"/>']
for i, (system, points) in enumerate(sorted(runs.items())):
    points.sort()
    x0 = i * W
    gmin, gmax = points[0][0], points[-1][0]
    base = points[0][1]
    ymax = max(max(v for _, v in points), base * 1.2) * 1.1

    def px(g):
        span = math.log(gmax) - math.log(gmin) or 1
        return x0 + PAD + (math.log(g) - math.log(gmin)) / span * (W - 2 * PAD)

    def py(v):
        return H - PAD - v / ymax * (H - 2 * PAD)

    out.append('<text x="%d" y="24" font-size="14" font-weight="bold">%s: W3 deliveries/s by groups</text>' % (x0 + PAD, system))
    out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#d8ecd8"/>'
               % (x0 + PAD, py(base * 1.2), W - 2 * PAD, py(base * 0.8) - py(base * 1.2)))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x0 + PAD, H - PAD, x0 + W - PAD, H - PAD))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x0 + PAD, PAD, x0 + PAD, H - PAD))
    for k in range(0, 6):
        v = ymax * k / 5
        out.append('<text x="%d" y="%.1f" text-anchor="end">%dk</text>' % (x0 + PAD - 6, py(v) + 4, round(v / 1000)))
    out.append('<polyline fill="none" stroke="#1f5fa8" stroke-width="2" points="%s"/>'
               % " ".join("%.1f,%.1f" % (px(g), py(v)) for g, v in points))
    for j, (g, v) in enumerate(points):
        out.append('<circle cx="%.1f" cy="%.1f" r="4" fill="#1f5fa8"/>' % (px(g), py(v)))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(g), H - PAD + 18, g))
        anchor, dx = ("start", 8) if j == 0 else ("end", -8) if j == len(points) - 1 else ("middle", 0)
        out.append('<text x="%.1f" y="%.1f" text-anchor="%s">%.1fk</text>' % (px(g) + dx, py(v) - 10, anchor, v / 1000))
    out.append('<text x="%d" y="%d" text-anchor="middle">groups (the green band: within 20%% of %d groups)</text>'
               % (x0 + W // 2, H - 16, gmin))
out.append("</svg>")
print("\n".join(out))
