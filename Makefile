.PHONY: lint typecheck test test-unit bench

lint:
	python3 -m ruff check .
	python3 -m ruff format --check .

typecheck:
	python3 -m mypy

test:
	python3 -m pytest

test-unit:
	python3 -m pytest tests/unit

bench:
	python3 tests/bench/bench_verifier.py
	python3 tests/bench/bench_fleet.py
