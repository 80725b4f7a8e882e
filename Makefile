.PHONY: install lint typecheck unit fast test slow sweep demo ci

# CONTRIBUTING.md says what each tier needs and how long it takes.

install:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,sdk]'

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/lint-imports --no-cache

typecheck:
	.venv/bin/mypy

# The first tier to run: pure functions, no service and no system binary.
unit:
	.venv/bin/python -m pytest tests/unit -q

# The same tier on every core.
fast:
	.venv/bin/python -m pytest tests/unit -q -n auto

# The README's test command: every tier but the slow one (needs Postgres, Redis and the
# Debian packages .ci/run installs).
test:
	.venv/bin/python -m pytest

# The long fuzz and the promises' state machine; CI runs this tier too.
slow:
	.venv/bin/python -m pytest -m "slow and not sweep" -q

# The whole fault matrix through real processes (20-40 minutes); CI leaves it out.
sweep:
	.venv/bin/python -m pytest -m sweep -q

demo:
	.venv/bin/callgate demo

ci:
	bash .ci/run
