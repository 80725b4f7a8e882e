"""The chaos run's table (one row per scenario) and its JSON form."""

from __future__ import annotations

from typing import Any, TextIO

from callgate.ops.lab.chaos.runner import Report

COLUMNS = (
    ("scenario", 30),
    ("faults injected", 34),
    ("calls", 6),
    ("side effects", 13),
    ("handler runs", 13),
    ("takeovers", 10),
    ("fence rej.", 11),
    ("recovery", 9),
    ("verdict", 14),
)


def _faults(r: Report) -> str:
    if r.verdict == "not applicable":
        return "-"
    seen: dict[str, int] = {}
    jobs = 0
    for f in r.faults:
        seen[f["action"]] = seen.get(f["action"], 0) + 1
        jobs += int(f.get("jobs", 0))
    names = []
    for action, n in seen.items():
        label = action if n == 1 else f"{action}×{n}"
        names.append(f"{label} ({jobs} jobs)" if action == "duplicate" else label)
    return ", ".join(names) or "none"


def _recovery(r: Report) -> str:
    if r.verdict == "not applicable" or not r.faults:
        return "-"
    if r.recovery_seconds is None:
        return "open"
    return f"{r.recovery_seconds:.1f} s"


def row(r: Report) -> list[str]:
    c = r.counts
    na = r.verdict == "not applicable"
    fenced = c.get("fence_rejections", 0) + c.get("stale_completions", 0)
    return [
        r.name,
        _faults(r),
        "-" if na else str(c.get("calls", 0)),
        "-" if na else str(c.get("side_effects", 0)),
        "-" if na else str(c.get("invocations", 0)),
        "-" if na else str(c.get("takeovers", 0)),
        "-" if na else str(fenced),
        _recovery(r),
        r.verdict.upper() if r.verdict != "not applicable" else "n/a",
    ]


def write_table(reports: list[Report], out: TextIO) -> None:
    """The table, then one line per violation and per scenario that did not apply."""
    widths = [max(w, *(len(row(r)[i]) for r in reports)) for i, (_, w) in enumerate(COLUMNS)]
    header = [name for name, _ in COLUMNS]
    out.write("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip() + "\n")
    for r in reports:
        cells = row(r)
        out.write("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        out.write("\n")
    notes = []
    for r in reports:
        if r.verdict == "not applicable":
            notes.append(f"{r.name}: not applicable: {r.reason}")
        notes.extend(f"{r.name}: violation: {v}" for v in r.violations)
        notes.extend(f"{r.name}: unexpected: {v}" for v in r.unexpected)
    if notes:
        out.write("\n" + "\n".join(notes) + "\n")
    failed = sum(r.failed for r in reports)
    passed = sum(r.verdict == "pass" for r in reports)
    skipped = len(reports) - failed - passed
    out.write(
        f"\n{passed} passed, {failed} failed, {skipped} not applicable"
        " (fence rej.: a stale owner's write refused by the downstream's fence, or its"
        " completion refused by the guard; handler runs: rows of chaos.invocations)\n"
    )


def as_json(reports: list[Report], *, seed: int, extra: dict[str, Any] | None = None) -> Any:
    return {
        "seed": seed,
        "passed": all(not r.failed for r in reports),
        "scenarios": [r.as_json() for r in reports],
        **(extra or {}),
    }
