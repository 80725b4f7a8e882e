"""The report of ``callgate eval bfcl-multi-turn``: BFCL's verdicts (the model's table) and
the executor check (the executor's table), as Markdown and as JSON with every call."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from callgate.ops.lab.eval.bfcl_multi_turn import EntryRun


def summary(runs: list[EntryRun]) -> dict[str, Any]:
    scored = [r for r in runs if r.skipped is None]
    executed = [r for r in scored if r.state_equal is not None]
    valid = sum(bool(r.bfcl_valid) for r in scored)
    return {
        "entries": len(runs),
        "skipped": len(runs) - len(scored),
        "bfcl_valid": valid,
        "bfcl_invalid": len(scored) - valid,
        "bfcl_accuracy": valid / len(scored) if scored else None,
        "executed": len(executed),
        "calls": sum(len(r.calls) for r in executed),
        "refusals": sum(r.refusals for r in executed),
        "effects": sum(r.effects for r in executed),
        "correlation_complete": sum(r.correlated for r in executed),
        "state_equal": sum(bool(r.state_equal) for r in executed),
        "responses_equal": sum(r.responses_equal for r in executed),
        "responses_redacted": sum(r.redacted for r in executed),
        "executor_ok": sum(r.executor_ok for r in executed),
    }


def tables(runs: list[EntryRun]) -> str:
    """The model's table (BFCL's verdicts) and the executor's, as Markdown."""
    total = summary(runs)
    lines = ["## The model (BFCL's multi_turn_checker)", ""]
    lines += ["| entry | turns | calls | BFCL | error |", "|---|---|---|---|---|"]
    for r in runs:
        verdict = "skipped" if r.skipped else ("valid" if r.bfcl_valid else "invalid")
        error = r.skipped or r.bfcl_error or ""
        lines.append(f"| {r.id} | {r.turns} | {len(r.calls)} | {verdict} | {error} |")
    accuracy = total["bfcl_accuracy"]
    shown = "n/a" if accuracy is None else f"{accuracy:.3f}"
    lines += [
        "",
        f"BFCL: {total['bfcl_valid']} valid, {total['bfcl_invalid']} invalid, accuracy {shown} "
        f"({total['skipped']} skipped)",
        "",
        "## The executor (callgate's workers against BFCL's in-process execution)",
        "",
        "| entry | calls | callgate turns | refusals | effects | writes ok | correlation "
        "| responses equal | state equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.state_equal is None:
            continue
        lines.append(
            f"| {r.id} | {len(r.calls)} | {r.callgate_turns} | {r.refusals} | {r.effects} "
            f"| {r.writes_succeeded} | {_yes(r.correlated)} | {_responses(r)} "
            f"| {_yes(bool(r.state_equal))} |"
        )
    lines += [
        "",
        f"Executor: {total['executor_ok']}/{total['executed']} entries exact; "
        f"{total['calls']} calls, {total['refusals']} refused, {total['effects']} effects; "
        f"state equal {total['state_equal']}/{total['executed']}, responses equal "
        f"{total['responses_equal']}/{total['executed']} ({total['responses_redacted']} "
        "responses differ by a redacted secret), correlation complete "
        f"{total['correlation_complete']}/{total['executed']}",
    ]
    return "\n".join(lines) + "\n"


def _responses(r: EntryRun) -> str:
    if r.responses_equal:
        return "yes"
    return f"NO ({r.redacted} redacted)" if r.redacted else "NO"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def write(runs: list[EntryRun], out: Path, command: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": command,
        "summary": summary(runs),
        "entries": [
            {
                **asdict(r),
                "refusals": r.refusals,
                "responses_redacted": r.redacted,
                "executor_ok": r.executor_ok,
            }
            for r in runs
        ],
    }
    paths = [out / "bfcl-multi-turn.json", out / "bfcl-multi-turn.md"]
    paths[0].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths[1].write_text(tables(runs))
    return paths
