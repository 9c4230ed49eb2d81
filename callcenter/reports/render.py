"""A report as JSON (everything), CSV (one line per interval) or HTML (one page, no script, no
external file: the plots are inline SVG, so it opens anywhere and can be mailed)."""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
from typing import Any

CSV_FIELDS = ("start", "offered", "contained", "transferred", "abandoned", "timed_out", "callbacks", "voicemails",
              "failed", "dialled", "dialled_answered", "handle_time_mean_s", "voice_to_voice_median_ms")
# the stacked bars: outcome groups and their colours
STACK = (("contained", "#2e7d32"), ("transferred", "#1565c0"), ("abandoned", "#c62828"),
         ("timed_out", "#ef6c00"), ("voicemails", "#6a1b9a"), ("failed", "#424242"))
PLOT_W, PLOT_H, PAD = 760, 220, 36


def when(ts: float, interval_s: int) -> str:
    t = dt.datetime.fromtimestamp(ts).astimezone()
    return t.strftime("%Y-%m-%d") if interval_s >= 86400 else t.strftime("%Y-%m-%d %H:%M")


def as_json(rep: dict[str, Any]) -> str:
    return json.dumps(rep, indent=1) + "\n"


def as_csv(rep: dict[str, Any]) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(CSV_FIELDS)
    for b in rep["intervals"]:
        w.writerow([when(b["start"], rep["period"]["interval_s"]), *(
            "" if b.get(f) is None else b[f] for f in CSV_FIELDS[1:])])
    return out.getvalue()


def _bars(rep: dict[str, Any]) -> str:
    bs = rep["intervals"]
    top = max([sum(b[k] for k, _ in STACK) for b in bs] + [1])
    width = (PLOT_W - 2 * PAD) / max(1, len(bs))
    parts = [f'<svg class="plot" id="calls-plot" width="{PLOT_W}" height="{PLOT_H}" role="img" '
             f'aria-label="calls per interval by outcome">',
             f'<line x1="{PAD}" y1="{PLOT_H - PAD}" x2="{PLOT_W - PAD}" y2="{PLOT_H - PAD}" stroke="#888"/>',
             f'<text x="4" y="{PAD - 6}" font-size="11">{top} calls</text>']
    for i, b in enumerate(bs):
        y = PLOT_H - PAD
        for key, colour in STACK:
            h = (PLOT_H - 2 * PAD) * b[key] / top
            if h > 0:
                y -= h
                parts.append(f'<rect x="{PAD + i * width + 1:.1f}" y="{y:.1f}" width="{max(1.0, width - 2):.1f}" '
                             f'height="{h:.1f}" fill="{colour}"><title>{html.escape(key)}: {b[key]}</title></rect>')
    step = max(1, len(bs) // 8)
    for i in range(0, len(bs), step):
        parts.append(f'<text x="{PAD + i * width:.1f}" y="{PLOT_H - PAD + 14}" font-size="10">'
                     f'{html.escape(when(bs[i]["start"], rep["period"]["interval_s"])[5:])}</text>')
    legend = "".join(f'<span style="color:{c}">■</span> {k.replace("_", " ")} ' for k, c in STACK)
    return "".join(parts) + "</svg>" + f'<p class="legend">{legend}</p>'


def _line(rep: dict[str, Any]) -> str:
    points = [(i, b["voice_to_voice_median_ms"]) for i, b in enumerate(rep["intervals"])
              if b["voice_to_voice_median_ms"] is not None]
    if not points:
        return "<p>No turns with a measured reply time in this period.</p>"
    top = max(v for _, v in points) * 1.2
    n = max(1, len(rep["intervals"]) - 1)
    xy = [(PAD + (PLOT_W - 2 * PAD) * i / n, PLOT_H - PAD - (PLOT_H - 2 * PAD) * v / top) for i, v in points]
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#1565c0"><title>{v} ms</title></circle>'
                   for (x, y), (_, v) in zip(xy, points))
    return (f'<svg class="plot" id="v2v-plot" width="{PLOT_W}" height="{PLOT_H}" role="img" '
            f'aria-label="reply time per interval"><polyline fill="none" stroke="#1565c0" stroke-width="2" '
            f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in xy)}"/>{dots}'
            f'<text x="4" y="{PAD - 6}" font-size="11">{top:.0f} ms</text></svg>')


def _table(rows: list[dict[str, Any]] | list[tuple], headers: list[str], table_id: str) -> str:
    if not rows:
        return f'<p id="{table_id}">None in this period.</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>"
                                    for v in (r.values() if isinstance(r, dict) else r)) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def as_html(rep: dict[str, Any], title: str = "Contact center report") -> str:
    p, t = rep["period"], rep["totals"]
    span = f"{when(p['since'], 86400)} to {when(p['until'] - 1, 86400)}"
    tiles = "".join(f'<div class="tile"><b>{html.escape(str(v if v is not None else "—"))}</b><br>{html.escape(k)}</div>'
                    for k, v in (("offered", t["offered"]), ("contained", t["contained"]),
                                 ("transferred", t["transferred"]), ("abandoned", t["abandoned"]),
                                 ("handle time (s, mean)", t["handle_time_mean_s"]),
                                 ("reply time (ms, median)", t["voice_to_voice_median_ms"]),
                                 ("dialled", t["dialled"])))
    funnels = "".join(f"<h3>{html.escape(flow)}</h3>" + _table(nodes, ["node", "reached", "callers left here"],
                                                               f"funnel-{html.escape(flow)}")
                      for flow, nodes in rep["funnel"].items()) or "<p>No calls.</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}: {html.escape(span)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
.tile {{ display: inline-block; margin: 0 1em 1em 0; padding: .6em 1em; background: #f2f2f2; border-radius: 6px; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }} td, th {{ border: 1px solid #ccc; padding: .2em .6em; }}
th {{ background: #f2f2f2; }} .legend {{ font-size: 12px; }}
</style></head><body>
<h1>{html.escape(title)}</h1><p id="period">{html.escape(span)}, every {p['interval_s'] // 60} min</p>
<div id="totals">{tiles}</div>
<h2>Calls by outcome</h2>{_bars(rep)}
<h2>Reply time after the caller stops (median per interval)</h2>{_line(rep)}
<h2>Queues</h2>{_table(rep["queues"], ["queue", "entered", "answered", "abandoned", "timed out", "callbacks",
                                       "speed of answer (s)", "SL threshold (s)", "service level %"], "queues")}
<h2>Human agents</h2>{_table(rep["agents"], ["agent", "answered", "handle time (s, mean)"], "agents")}
<h2>Where callers leave each flow</h2>{funnels}
<h2>Top intents</h2>{_table(rep["intents"], ["intent", "calls"], "intents")}
<h2>Top categories</h2>{_table(rep["categories"], ["category", "calls"], "categories")}
<h2>Quality scorecards</h2>{_table(rep.get("scorecards") or [], ["flow", "item", "calls", "passed", "pass %",
                                                                  "overridden"], "scorecards")}
<p>Every figure is defined in docs/guide/reports.md.</p>
</body></html>
"""
