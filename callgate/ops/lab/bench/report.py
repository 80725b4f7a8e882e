"""Writes a bench's results: ``bench.json``, ``bench.md`` (the tables) and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TITLES = {
    "noop": "No-op reads (get_stock)",
    "write": "Writes (refund_payment)",
    "io": "100 ms tools",
}
PLOTS = ("throughput.png", "latency.png")


def write(out: Path, result: dict[str, Any], command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps({"command": command, **result}, indent=2) + "\n")
    paths[1].write_text(markdown(result, command))
    paths += plot(out, result)
    return paths


def markdown(result: dict[str, Any], command: str) -> str:
    cfg = result["config"]
    lines = [
        f"`{command}` — median of {cfg['repeat']}, every ratio against a baseline measured "
        "in the same run, interleaved.",
    ]
    if cfg.get("indicative_only"):
        lines += ["", f"**Indicative only:** {cfg['indicative_why']}"]
    lines += [
        "",
        "| scenario | W | K | callgate /s | baseline | baseline /s | ratio | callgate W/W1 "
        "| baseline W/W1 | threaded ceiling /s | ÷ ceiling |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, block in result["throughput"].items():
        for row in block["rows"]:
            ceiling, vs = _ceiling(row)
            lines.append(
                f"| {TITLES[scenario]} | {row['workers']} | {row['concurrency']} "
                f"| {row['callgate_per_s']:g} | {block['baseline']} | {row['baseline_per_s']:g} "
                f"| {row['ratio']:.2f}× | {row['callgate_scaling']:.2f}× "
                f"| {row['baseline_scaling']:.2f}× | {ceiling} | {vs} |"
            )
    red = result["redelivery"]
    lines.append(
        f"| Writes delivered 3× | 4 | 1 | {red['thrice_per_s']:g} | the same delivered once "
        f"| {red['once_per_s']:g} | {red['ratio']:.2f}× | | |"
    )
    if fan := result.get("fanin"):
        lines.append(
            f"| Fan-in 120/280/200 ms, end to end | 3 | 1 | {fan['end_to_end_ms']:g} ms "
            f"| slowest read / one after another | {fan['slowest_read_ms']} / "
            f"{fan['one_after_another_ms']} ms | {fan['vs_slowest']:.2f}× / "
            f"{fan['vs_one_after_another']:.2f}× | | |"
        )
    effects = red["side_effects"]
    lines += [
        "",
        f"Redelivery: {sum(e['operations'] for e in effects)} operations, "
        f"{sum(e['effects'] for e in effects)} side effects in `downstream.side_effects` "
        f"(exactly one each: {'yes' if red['exactly_one_side_effect_each'] else 'NO'}); "
        f"duplicate deliveries traced: {red['duplicate_deliveries_traced']}. "
        f"Every call ended: {'yes' if result['checks']['every_call_ended'] else 'NO'} "
        f"({result['checks']['ended']} of {result['checks']['calls']}).",
    ]
    lines += _baselines(result)
    if lat := result.get("latency"):
        lines += [
            "",
            f"Latency per stage, ms ({lat['turns']} turns of {lat['calls_per_turn']} no-op "
            f"reads one after another, {lat['workers']} running workers; Postgres timestamps, "
            "end to end from the producer's clock):",
            "",
            "| stage | p50 | p95 | p99 |",
            "|---|---:|---:|---:|",
        ]
        for stage, p in lat["stages_ms"].items():
            lines.append(f"| {stage} | {p['p50']:g} | {p['p95']:g} | {p['p99']:g} |")
        p = lat["turn_end_to_end_ms"]
        lines.append(
            f"| turn: submit → collect complete | {p['p50']:g} | {p['p95']:g} | {p['p99']:g} |"
        )
    if rts := result.get("round_trips"):
        lines += [
            "",
            "Per call, counted (RQ worker start/stop excluded): Postgres statements / commits, "
            "Redis commands / round trips:",
            "",
            "| kind | submit (producer) | worker | relayer | collect | downstream stmts |",
            "|---|---|---|---|---|---:|",
        ]
        for kind, rt in rts.items():
            cells = [_traffic(rt["phases"][p]) for p in ("submit", "worker", "relayer", "collect")]
            ds = rt["phases"]["worker"]["downstream_statements"]
            lines.append(f"| {kind} | {' | '.join(cells)} | {ds:g} |")
        rq = next(iter(rts.values()))["bare_rq"]
        lines.append(
            f"| bare RQ no-op job | Redis {rq['enqueue_redis_commands']:g} / "
            f"{rq['enqueue_redis_round_trips']:g} | Redis {rq['worker_redis_commands']:g} / "
            f"{rq['worker_redis_round_trips']:g} | | | |"
        )
    if mem := result.get("memory"):
        per = mem["per_in_flight_call_kib"]
        lines += [
            "",
            f"Memory: one worker holds {mem['rss_idle_mib']:g} MiB idle and "
            f"{mem['rss_busy_mib']:g} MiB with {mem['in_flight']} call(s) in flight "
            f"(CALLGATE_WORKER_CONCURRENCY={mem['concurrency_setting']}): "
            + (f"{per:g} KiB per in-flight call." if per is not None else "none in flight."),
        ]
    lines += ["", "Plots: " + ", ".join(PLOTS), ""]
    return "\n".join(lines)


def _ceiling(row: dict[str, Any]) -> tuple[str, str]:
    """The threaded ceiling's figure and callgate's ratio to it, or blanks (a scenario
    without one)."""
    if row.get("threaded_ceiling_per_s") is None:
        return "", ""
    return f"{row['threaded_ceiling_per_s']:g}", f"{row['ratio_to_threaded_ceiling']:.2f}×"


def _baselines(result: dict[str, Any]) -> list[str]:
    """Every system of the scenarios that have a threaded ceiling, one row each."""
    lines: list[str] = []
    for scenario, block in result["throughput"].items():
        rows = block["rows"]
        if not rows or rows[0].get("threaded_ceiling") is None:
            continue
        bound = "in_flight_bound_per_s" in rows[0]
        lines += [
            "",
            f"{TITLES[scenario]}, every system (W processes × threads each; ceiling "
            f"= {rows[0]['baselines'][rows[0]['threaded_ceiling']]['label']}):",
            "",
            "| system | W | threads | /s | callgate ÷ this |"
            + (" of the bound |" if bound else ""),
            "|---|---:|---:|---:|---:|" + ("---:|" if bound else ""),
        ]
        for row in rows:
            for name, b in row["baselines"].items():
                mark = " (threaded ceiling)" if name == row["threaded_ceiling"] else ""
                lines.append(
                    f"| {b['label']}{mark} | {b['workers']} | {b['threads']} | {b['per_s']:g} "
                    f"| {b['callgate_ratio']:.2f}× |" + (f" {b['of_bound']:.2f} |" if bound else "")
                )
            lines.append(
                f"| **callgate** | {row['workers']} | {row['concurrency']} "
                f"| {row['callgate_per_s']:g} | 1.00× |"
                + (f" {row['callgate_of_bound']:.2f} |" if bound else "")
            )
        if bound:
            lines.append(
                "\nThe bound: W × threads / the tool's delay, every slot always waiting on a "
                f"tool (callgate, W = {rows[-1]['workers']}: "
                f"{rows[-1]['in_flight_bound_per_s']:g}/s)."
            )
    return lines


def _traffic(c: dict[str, float]) -> str:
    return (
        f"PG {c['pg_statements']:g} / {c['pg_commits']:g}, "
        f"Redis {c['redis_commands']:g} / {c['redis_round_trips']:g}"
    )


def plot(out: Path, result: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = result["throughput"]
    fig, axes = plt.subplots(1, len(blocks), figsize=(4 * len(blocks), 3.6))
    for ax, (scenario, block) in zip(axes, blocks.items(), strict=True):
        rows = block["rows"]
        xs = list(range(len(rows)))
        ax.bar([x - 0.27 for x in xs], [r["callgate_per_s"] for r in rows], 0.27, label="callgate")
        ax.bar([x for x in xs], [r["baseline_per_s"] for r in rows], 0.27, label="bare RQ")
        ax.bar(
            [x + 0.27 for x in xs],
            [r.get("threaded_ceiling_per_s") or 0 for r in rows],
            0.27,
            label="threaded ceiling",
        )
        ax.set_xticks(xs, [f"W={r['workers']}" for r in rows])
        ax.set_title(TITLES[scenario], fontsize=10)
        ax.set_ylabel("calls/s")
        for x, r in zip(xs, rows, strict=True):
            ax.annotate(
                f"{r['ratio']:.2f}×",
                (x, max(r["callgate_per_s"], r["baseline_per_s"])),  # ÷ bare RQ
                ha="center",
                va="bottom",
                fontsize=8,
            )
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    throughput = out / PLOTS[0]
    fig.savefig(throughput, dpi=110)
    plt.close(fig)

    paths = [throughput]
    if lat := result.get("latency"):
        stages = lat["stages_ms"]
        fig, ax = plt.subplots(figsize=(7, 3.6))
        xs = list(range(len(stages)))
        for i, p in enumerate(("p50", "p95", "p99")):
            ax.bar([x + (i - 1) * 0.27 for x in xs], [s[p] for s in stages.values()], 0.27, label=p)
        ax.set_xticks(xs, list(stages), fontsize=8)
        ax.set_ylabel("ms")
        ax.set_title("Latency per stage (no-op reads)", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / PLOTS[1]
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
