"""``CALLGATE_DEMO_DELAY_MS``: slow a demo tool so a test can land a kill inside its crash gap.

Format: ``tool=before[:after],tool=before`` in milliseconds, e.g.
``refund_payment=0:300,get_weather=120`` (sleep before / after the downstream call).
"""

from __future__ import annotations

import math

from callgate.core.errors import ConfigurationError

Delays = dict[str, tuple[float, float]]


def parse(spec: str | None) -> Delays:
    delays: Delays = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        tool, sep, value = item.partition("=")
        before, _, after = value.partition(":")
        try:
            if not sep or not tool.strip():
                raise ValueError
            pair = (float(before) / 1000, float(after or 0) / 1000)
        except ValueError:
            raise ConfigurationError(
                f"CALLGATE_DEMO_DELAY_MS: {item!r} is not 'tool=before_ms[:after_ms]'"
            ) from None
        if not all(math.isfinite(x) and x >= 0 for x in pair):
            raise ConfigurationError(
                f"CALLGATE_DEMO_DELAY_MS: {item!r} needs finite, non-negative delays"
            )
        delays[tool.strip()] = pair
    return delays
