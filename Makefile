.PHONY: install lint typecheck test demo ci

install:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,sdk]'

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

typecheck:
	.venv/bin/mypy

test:
	.venv/bin/python -m pytest

demo:
	.venv/bin/callgate demo

ci:
	bash .ci/run
