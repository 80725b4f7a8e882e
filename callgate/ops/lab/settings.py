"""The lab's own variables, the demo's and the bench's, declared like the product's
(callgate.core.settings) but apart from them, as the lab is."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from callgate.core.settings import Flag, Section, setting


class DemoSettings(Section):
    model_config = SettingsConfigDict(env_prefix=f"{Section.model_config['env_prefix']}DEMO_")

    approval_amount: int = setting(
        100_000, "Demo refunds of at least this amount need an approval.", ge=1
    )
    delay_ms: str | None = setting(
        None,
        "Slows demo tools: tool=before[:after] in milliseconds, comma-separated.",
    )


class BenchSettings(Section):
    model_config = SettingsConfigDict(env_prefix=f"{Section.model_config['env_prefix']}BENCH_")

    quick: Flag = setting(False, "W = 1,2, fewer calls, one repeat.")
    out: Path = setting(Path("bench-results"), "Folder for bench.json, bench.md and the plots.")
    workers: str | None = setting(None, "Worker counts to compare, e.g. 1,2,4.")
    calls: int | None = setting(None, "Calls per throughput run.", ge=20)
    repeat: int | None = setting(None, "Repeats; figures are medians.", ge=1)
    concurrency: int = setting(
        32, "Calls in flight per worker for the slow tools and the memory figure.", ge=1
    )


class EvalSettings(Section):
    model_config = SettingsConfigDict(env_prefix=f"{Section.model_config['env_prefix']}EVAL_")

    stubs: Path | None = setting(
        None, "Set by 'callgate eval run': the imported suite's stub tools file (tools.json)."
    )
    max_file_bytes: int = setting(
        16_777_216,
        "Largest file 'callgate eval' reads, in bytes; larger is refused unread.",
        ge=1,
    )
    start_seconds: float = setting(
        60.0, "Seconds 'callgate eval run' waits for its workers to start.", ge=0.01
    )
    scratch_prefix: str = setting(
        "callgate_eval_",
        "Name prefix of the scratch databases 'callgate eval' creates on a shared server.",
    )
