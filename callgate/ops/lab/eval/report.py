"""The report: metrics aggregated from the checks, and its JSON, Markdown and HTML forms.

The model's table and the executor's are kept apart (and the final answer's after them).
Every failed check is listed with its fixture, what was expected, what happened and the id
``callgate trace`` takes. The HTML page is self-contained: inline SVG, no script, no network.
Pure, except ``write``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from callgate.ops.lab.eval.scoring import BY_KEY, METRICS, Check, TurnRun, score

VERSION = 1
TABLES = (("model", "Model"), ("executor", "Executor"), ("final", "Final answer"))


def build(
    suite: str, answer: str, turns: Sequence[TurnRun], *, command: str = "", seconds: float = 0
) -> dict[str, Any]:
    checks = [c for t in turns for c in score(t)]
    categories = sorted({t.category for t in turns})
    return {
        "version": VERSION,
        "suite": suite,
        "answer": answer,
        "command": command,
        "seconds": round(seconds, 2),
        "fixtures": len({t.fixture_id for t in turns}),
        "surfaces": sorted({t.surface for t in turns}),
        "metrics": metrics(checks),
        "categories": {
            c: {
                table: _share(
                    [k for k in checks if k.category == c and BY_KEY[k.metric].table == table]
                )
                for table, _ in TABLES
            }
            for c in categories
        },
        "failures": [_failure(c) for c in checks if not c.passed],
    }


def metrics(checks: Iterable[Check]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    listed = list(checks)
    for m in METRICS:
        mine = [c for c in listed if c.metric == m.key]
        passed = sum(c.passed for c in mine)
        total = len(mine)
        failed = total - passed
        value = None if not total else (failed if m.lower_is_better else passed) / total
        out[m.key] = {
            "label": m.label,
            "table": m.table,
            "passed": passed,
            "total": total,
            "value": value,
            "lower_is_better": m.lower_is_better,
        }
    return out


def _share(checks: Sequence[Check]) -> float | None:
    return None if not checks else sum(c.passed for c in checks) / len(checks)


def _failure(c: Check) -> dict[str, Any]:
    return {
        "metric": c.metric,
        "table": BY_KEY[c.metric].table,
        "fixture": c.fixture_id,
        "category": c.category,
        "surface": c.surface,
        "turn": c.turn_index,
        "expected": c.expected,
        "actual": c.actual,
        "trace": c.trace_id,
    }


def _value(m: Mapping[str, Any]) -> str:
    if m["value"] is None:
        return "n/a"
    count = m["total"] - m["passed"] if m["lower_is_better"] else m["passed"]
    return f"{m['value'] * 100:.1f}% ({count}/{m['total']})"


def markdown(report: Mapping[str, Any]) -> str:
    lines = [
        f"# callgate eval: {report['suite']} ({report['answer']} answers)",
        "",
        f"{report['fixtures']} fixtures on {', '.join(report['surfaces'])}"
        f" in {report['seconds']} s.",
        "",
    ]
    for table, title in TABLES:
        rows = [(k, m) for k, m in report["metrics"].items() if m["table"] == table]
        if table == "final" and all(m["total"] == 0 for _, m in rows):
            continue
        lines += [f"## {title}", "", "| metric | value |", "|---|---|"]
        for _, m in rows:
            better = " (lower is better)" if m["lower_is_better"] else ""
            lines.append(f"| {m['label']}{better} | {_value(m)} |")
        lines.append("")
    lines += [
        "## By category",
        "",
        "| category | model | executor | final answer |",
        "|---|---|---|---|",
    ]
    for category, shares in report["categories"].items():
        cells = [_pct(shares.get(t)) for t, _ in TABLES]
        lines.append(f"| {category} | {' | '.join(cells)} |")
    lines.append("")
    failures = report["failures"]
    lines += [f"## Failures ({len(failures)})", ""]
    if failures:
        lines += ["| table | metric | fixture | surface | turn | expected | actual | trace |"]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for f in failures:
            cells = [f["table"], f["metric"], f["fixture"], f["surface"], str(f["turn"])]
            cells += [f["expected"], f["actual"], f"`{f['trace']}`"]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines += ["", "`callgate trace TRACE` shows what happened to a call."]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def tables(report: Mapping[str, Any]) -> str:
    """The two tables (and the final answer's) as plain text for a terminal."""
    out: list[str] = []
    for table, title in TABLES:
        rows = [m for m in report["metrics"].values() if m["table"] == table]
        if table == "final" and all(m["total"] == 0 for m in rows):
            continue
        out.append(f"{title}")
        width = max(len(m["label"]) for m in rows) + 2
        for m in rows:
            arrow = " ↓" if m["lower_is_better"] else ""
            out.append(f"  {(m['label'] + arrow).ljust(width)}{_value(m)}")
        out.append("")
    out.append(f"{len(report['failures'])} failed check(s)")
    return "\n".join(out) + "\n"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def page(report: Mapping[str, Any]) -> str:
    """A self-contained HTML page: both tables, a bar chart per category, the failures."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>callgate eval: {e(report['suite'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
        "th{background:#f4f4f4}.bad{color:#b00}</style></head><body>",
        f"<h1>callgate eval: {e(report['suite'])} ({e(report['answer'])} answers)</h1>",
        f"<p>{report['fixtures']} fixtures on {e(', '.join(report['surfaces']))}.</p>",
    ]
    for table, title in TABLES:
        rows = [m for m in report["metrics"].values() if m["table"] == table]
        if table == "final" and all(m["total"] == 0 for m in rows):
            continue
        parts.append(f"<h2>{title}</h2><table><tr><th>metric</th><th>value</th></tr>")
        for m in rows:
            better = " (lower is better)" if m["lower_is_better"] else ""
            parts.append(f"<tr><td>{e(m['label'] + better)}</td><td>{e(_value(m))}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>By category</h2>")
    parts.append(_chart(report["categories"]))
    parts.append(f"<h2>Failures ({len(report['failures'])})</h2>")
    if report["failures"]:
        head = ["table", "metric", "fixture", "surface", "turn", "expected", "actual", "trace"]
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>")
        for f in report["failures"]:
            keys = ["table", "metric", "fixture", "surface", "turn", "expected", "actual"]
            cells = [e(str(f[k])) for k in keys]
            cells.append(f"<code>{e(f['trace'])}</code>")
            parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


_COLOURS = {"model": "#4e79a7", "executor": "#f28e2b", "final": "#59a14f"}


def _chart(categories: Mapping[str, Mapping[str, float | None]]) -> str:
    """Horizontal bars: per category, the share of each table's checks that passed."""
    bar_h, gap, label_w, scale = 14, 10, 150, 300
    rows = []
    y = 20
    for category, shares in categories.items():
        rows.append(f"<text x='0' y='{y + bar_h}' font-size='12'>{html.escape(category)}</text>")
        for i, (table, _) in enumerate(TABLES):
            share = shares.get(table)
            if share is None:
                continue
            top = y + i * (bar_h + 2)
            width = round(share * scale)
            rows.append(
                f"<rect x='{label_w}' y='{top}' width='{width}' height='{bar_h}' "
                f"fill='{_COLOURS[table]}'><title>{table} {share * 100:.0f}%</title></rect>"
                f"<text x='{label_w + width + 4}' y='{top + bar_h - 3}' font-size='11'>"
                f"{table} {share * 100:.0f}%</text>"
            )
        y += 3 * (bar_h + 2) + gap
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{label_w + scale + 120}' "
        f"height='{y}' role='img'>" + "".join(rows) + "</svg>"
    )


def write(report: Mapping[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    stem = "eval-" + re.sub(r"[^\w.-]", "_", str(report["answer"]))
    paths = [folder / f"{stem}.json", folder / f"{stem}.md", folder / f"{stem}.html"]
    paths[0].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(report), encoding="utf-8")
    paths[2].write_text(page(report), encoding="utf-8")
    return paths
