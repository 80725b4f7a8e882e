"""``callgate eval compare BASE NEW``: each metric's change, and the regressions. Pure.

A metric where higher is better regresses when it falls by more than ``threshold``
(absolute, 0.02 by default). An error rate regresses when it grows by more than the threshold,
or reaches ``factor`` (5) times a non-zero baseline: an argument-failure rate going from 1% to
5% is a regression even though 4 points look small.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from callgate.core.errors import InputError


@dataclass(frozen=True)
class Change:
    key: str
    label: str
    table: str
    base: float | None
    new: float | None
    lower_is_better: bool
    regression: bool


def compare(
    base: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    threshold: float = 0.02,
    factor: float = 5.0,
) -> list[Change]:
    out = []
    for doc, name in ((base, "BASE"), (new, "NEW")):
        metrics = doc.get("metrics")
        if not isinstance(metrics, Mapping):
            raise InputError(f"{name} is not a callgate eval report (it has no metrics)")
        for key, metric in metrics.items():
            if not _is_metric(metric):
                raise InputError(
                    f"{name} is not a callgate eval report (metric {key!r} is not "
                    "{value: a number or null, ...})"
                )
    for key, b in base["metrics"].items():
        n = new["metrics"].get(key)
        if n is None:
            continue
        lower = bool(b.get("lower_is_better"))
        bv, nv = b.get("value"), n.get("value")
        out.append(
            Change(
                key,
                str(b.get("label", key)),
                str(b.get("table", "")),
                bv,
                nv,
                lower,
                _regressed(bv, nv, lower, threshold, factor),
            )
        )
    return out


def _is_metric(metric: Any) -> bool:
    if not isinstance(metric, Mapping):
        return False
    value = metric.get("value")
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _regressed(
    base: float | None, new: float | None, lower: bool, threshold: float, factor: float
) -> bool:
    if base is None or new is None:
        return False
    if not lower:
        return new < base - threshold
    return new > base + threshold or (base > 0 and new >= factor * base)


def render(changes: list[Change]) -> str:
    lines = []
    width = max((len(c.label) for c in changes), default=10) + 2
    for table in ("model", "executor", "final"):
        mine = [c for c in changes if c.table == table]
        if not mine:
            continue
        lines.append(table)
        for c in mine:
            arrow = " ↓" if c.lower_is_better else ""
            delta = "" if c.base is None or c.new is None else f"{(c.new - c.base) * 100:+.1f} pts"
            flag = "  REGRESSION" if c.regression else ""
            lines.append(
                f"  {(c.label + arrow).ljust(width)}{_pct(c.base):>7} → {_pct(c.new):>7}"
                f"  {delta}{flag}"
            )
    regressions = [c.key for c in changes if c.regression]
    lines.append("")
    lines.append(
        f"{len(regressions)} regression(s): {', '.join(regressions)}"
        if regressions
        else "no regression"
    )
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"
