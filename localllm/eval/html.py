"""The eval report as one self-contained HTML page: inline SVG, inline CSS, no scripts.

Accuracy against p50 latency per agent (a scatter, error bars to p95), the summary table,
per enum field a confusion table (expected label → answered value) shaded by count, and
for every tier that reports a confidence its risk–coverage curve (precision of the
accepted answers against the share accepted) with the thresholds chosen per target
precision and what a ``min_precision`` cascade would keep local.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from typing import Any

__all__ = ["render_html", "render_svg"]

_W, _H, _PAD = 640, 360, 56
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:960px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}caption{text-align:left;font-weight:bold;padding:4px 0}
.muted{color:#777;font-size:90%}
"""


def _frame(label: str, y: Callable[[float], float]) -> list[str]:
    """An SVG chart's opening: background, plot frame and 0–100 % gridlines on the y axis."""
    inner_w, inner_h = _W - 2 * _PAD, _H - 2 * _PAD
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" role="img" aria-label="{label}">',
        f'<rect width="{_W}" height="{_H}" fill="#fff"/>',
        f'<rect x="{_PAD}" y="{_PAD}" width="{inner_w}" height="{inner_h}" fill="none" stroke="#999"/>',
    ]
    for tick in range(0, 11, 2):
        v = tick / 10
        parts.append(
            f'<line x1="{_PAD}" x2="{_W - _PAD}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
            f'<text x="{_PAD - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{tick * 10}%</text>'
        )
    return parts


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value:.0f}"


def _scatter(agents: Mapping[str, Any]) -> str:
    points = [(alias, row) for alias, row in agents.items() if row["latency_ms"]["p50"] is not None]
    top = max([row["latency_ms"]["p95"] or row["latency_ms"]["p50"] for _, row in points] + [1.0]) * 1.1
    inner_w, inner_h = _W - 2 * _PAD, _H - 2 * _PAD

    def x(ms: float) -> float:
        return float(_PAD + inner_w * ms / top)

    def y(acc: float) -> float:
        return _H - _PAD - inner_h * acc

    parts = _frame("accuracy vs latency per agent", y)
    for i in range(6):
        ms = top * i / 5
        parts.append(f'<text x="{x(ms):.1f}" y="{_H - _PAD + 16}" font-size="11" text-anchor="middle">{ms:.0f}</text>')
    parts.append(
        f'<text x="{_W / 2}" y="{_H - 12}" font-size="12" text-anchor="middle">latency p50 (ms), bar to p95</text>'
    )
    parts.append(
        f'<text x="14" y="{_H / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {_H / 2})">accuracy</text>'
    )
    for i, (alias, row) in enumerate(points):
        colour = _COLOURS[i % len(_COLOURS)]
        p50, p95 = row["latency_ms"]["p50"], row["latency_ms"]["p95"] or row["latency_ms"]["p50"]
        acc = row["accuracy"] or 0.0
        parts.append(
            f'<line x1="{x(p50):.1f}" x2="{x(p95):.1f}" y1="{y(acc):.1f}" y2="{y(acc):.1f}" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<circle cx="{x(p50):.1f}" cy="{y(acc):.1f}" r="6" fill="{colour}">'
            f"<title>{escape(alias)}: {_pct(acc)} at {_ms(p50)} ms</title></circle>"
            f'<text x="{x(p50) + 9:.1f}" y="{y(acc) - 8:.1f}" font-size="12" fill="{colour}">'
            f"{escape(alias)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _summary(agents: Mapping[str, Any]) -> str:
    head = (
        "agent",
        "calls",
        "accuracy",
        "first try valid",
        "fallback",
        "errors",
        "p50 ms",
        "p95 ms",
        "tokens in/out",
        "cost $",
        "repro",
        "repro (labels)",
    )
    rows = [
        "<table><caption>Per agent</caption><tr>"
        + "".join(f'<th class="{"l" if i == 0 else ""}">{h}</th>' for i, h in enumerate(head))
        + "</tr>"
    ]
    for alias, row in agents.items():
        errors = ", ".join(f"{k} {v}" for k, v in row["errors"].items()) or "0"
        cells = (
            escape(alias),
            row["calls"],
            _pct(row["accuracy"]),
            _pct(row["schema_valid_first_try"]),
            _pct(row["fallback_rate"]),
            escape(errors),
            _ms(row["latency_ms"]["p50"]),
            _ms(row["latency_ms"]["p95"]),
            f"{row['tokens']['prompt']}/{row['tokens']['completion']}",
            f"{row['cost_usd']['total']:.4f}",
            _pct(row["reproducibility"]),
            _pct(row.get("reproducibility_labels")),
        )
        rows.append(
            "<tr>" + "".join(f'<td class="{"l" if i == 0 else ""}">{c}</td>' for i, c in enumerate(cells)) + "</tr>"
        )
    fields = sorted({name for row in agents.values() for name in row["fields"]})
    if fields:
        rows.append(
            '</table><table><caption>Accuracy per field</caption><tr><th class="l">agent</th>'
            + "".join(f"<th>{escape(f)}</th>" for f in fields)
            + "</tr>"
        )
        for alias, row in agents.items():
            rows.append(
                f'<tr><td class="l">{escape(alias)}</td>'
                + "".join(f"<td>{_pct(row['fields'].get(f, {}).get('accuracy'))}</td>" for f in fields)
                + "</tr>"
            )
    rows.append("</table>")
    return "".join(rows)


def _confusion(alias: str, name: str, table: Mapping[str, Mapping[str, int]]) -> str:
    answers = sorted({got for row in table.values() for got in row})
    peak = max([n for row in table.values() for n in row.values()] + [1])
    parts = [
        f"<table><caption>{escape(alias)}: {escape(name)} (rows: expected, columns: answered)</caption>"
        '<tr><th class="l"></th>' + "".join(f"<th>{escape(a)}</th>" for a in answers) + "</tr>"
    ]
    for want, row in table.items():
        parts.append(f'<tr><th class="l">{escape(want)}</th>')
        for got in answers:
            count = row.get(got, 0)
            shade = int(235 - 135 * count / peak)  # right answers green, wrong ones red
            colour = (f"rgb({shade},235,{shade})" if got == want else f"rgb(245,{shade},{shade})") if count else "#fff"
            parts.append(f'<td style="background:{colour}">{count or ""}</td>')
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


def _curves(calibration: Mapping[str, Any]) -> str:
    """Risk–coverage curves of every scored tier, one polyline each, on one SVG."""
    tiers = [(a, t) for a, t in (calibration.get("tiers") or {}).items() if t.get("curve")]
    if not tiers:
        return "<p>no tier reports a confidence</p>"
    inner_w, inner_h = _W - 2 * _PAD, _H - 2 * _PAD

    def x(coverage: float) -> float:
        return float(_PAD + inner_w * coverage)

    def y(precision: float) -> float:
        return float(_H - _PAD - inner_h * precision)

    parts = _frame("risk-coverage curve per tier", y)
    for tick in range(0, 11, 2):
        parts.append(
            f'<text x="{x(tick / 10):.1f}" y="{_H - _PAD + 16}" font-size="11" text-anchor="middle">{tick * 10}%</text>'
        )
    parts.append(
        f'<text x="{_W / 2}" y="{_H - 12}" font-size="12" text-anchor="middle">share answered (coverage)</text>'
        f'<text x="14" y="{_H / 2}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {_H / 2})">'
        "precision of the accepted answers</text>"
    )
    for i, (alias, tier) in enumerate(tiers):
        colour = _COLOURS[i % len(_COLOURS)]
        points = " ".join(f"{x(c):.1f},{y(p):.1f}" for _, c, p in tier["curve"])
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(
            f'<text x="{_W - _PAD - 4}" y="{_PAD + 16 + 14 * i}" font-size="12" text-anchor="end" '
            f'fill="{colour}">{escape(alias)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _decision(calibration: Mapping[str, Any], decision: Mapping[str, Any]) -> str:
    rows = []
    for alias, tier in (calibration.get("tiers") or {}).items():
        if not tier.get("scored"):
            continue
        for target, row in tier["targets"].items():
            value, held = row["threshold"]["value"], row["held_out"]
            rows.append(
                f'<tr><td class="l">{escape(alias)}</td><td>{escape(target)}</td>'
                f"<td>{'accept nothing' if value is None else f'{value:.3f}'}</td>"
                f"<td>{row['threshold']['lower_bound']:.3f}</td><td>{_pct(held['coverage'])}</td>"
                f"<td>{_pct(held['precision'])}</td><td>{tier['ece']}</td></tr>"
            )
    table = (
        "<table><caption>Thresholds (chosen on the calibration split, checked on the held-out split)</caption>"
        '<tr><th class="l">tier</th><th>target</th><th>threshold</th><th>lower bound</th>'
        "<th>held-out coverage</th><th>held-out precision</th><th>ECE</th></tr>" + "".join(rows) + "</table>"
    )
    sims = "".join(
        f"<tr><td>{escape(target)}</td><td>{_pct(sim['local_share'])}</td><td>{_pct(sim['local_precision'])}</td>"
        f"<td>{_pct(sim['cascade_accuracy'])}</td><td>{_pct(sim['strong_accuracy'])}</td>"
        f"<td>{_ms(sim['mean_ms'])}</td><td>{_ms(sim['strong_mean_ms'])}</td>"
        f"<td>{sim['cost_usd']:g}</td><td>{sim['strong_cost_usd']:g}</td></tr>"
        for target, sim in decision.items()
    )
    if sims:
        table += (
            "<table><caption>min_precision cascade on the held-out split vs the strong tier alone</caption>"
            "<tr><th>target</th><th>local share</th><th>local precision</th><th>cascade accuracy</th>"
            "<th>strong accuracy</th><th>mean ms</th><th>strong mean ms</th><th>cost $</th><th>strong cost $</th></tr>"
            + sims
            + "</table>"
        )
    return table


def render_svg(report: Mapping[str, Any]) -> str:
    """The accuracy-vs-latency picture alone, as an SVG document (for a README)."""
    return _scatter(report["agents"]) + "\n"


def render_html(report: Mapping[str, Any]) -> str:
    """The page for one report document."""
    agents = report["agents"]
    title = f"localllm eval: gate {report['gate']}"
    machine = report.get("machine") or {}
    confusions = "".join(
        _confusion(alias, name, table)
        for alias, row in agents.items()
        for name, table in row["confusion"].items()
        if table
    )
    duplicates = report.get("duplicate_cases")
    repeated = f" ({duplicates} more repeating a case: asked once)" if duplicates else ""
    examples = report.get("examples") or {}
    again = (
        f'<p class="muted">{examples["examples"]} examples in {escape(examples["file"])} '
        f"({examples['duplicate_examples']} more repeating an example, lines "
        f"{', '.join(map(str, examples['duplicate_lines']))}: one vote)</p>"
        if examples.get("duplicate_examples")
        else ""
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="muted">{report["cases"]} cases{repeated} × {report["repeat"]} repeat(s), '
        f"{escape(report['created'])}; "
        f"{escape(str(machine.get('platform', '')))}, {machine.get('cpus')} CPUs</p>{again}"
        f"<h2>Accuracy vs latency</h2>{_scatter(agents)}{_summary(agents)}"
        f"<h2>Confusion (enum fields)</h2>{confusions or '<p>no enum field in the schema</p>'}"
        f"<h2>Confidence: risk–coverage</h2>{_curves(report.get('calibration') or {})}"
        f"{_decision(report.get('calibration') or {}, report.get('decision') or {})}"
        "</body></html>\n"
    )
