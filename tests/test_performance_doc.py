"""docs/performance.md states the figures of the benchmarks' committed results, and no others:
each of its tables is the one ``python -m bench.report`` makes from ``bench/results/``."""

from __future__ import annotations

from bench import report


def test_every_table_of_the_performance_page_is_the_one_the_committed_results_make() -> None:
    in_doc = report.in_doc(report.DOC.read_text())
    made = report.tables()
    assert sorted(in_doc) == sorted(made), "run `python -m bench.report --write`"
    stale = [name for name in made if in_doc[name] != made[name]]
    assert not stale, (
        f"tables {stale} differ from the results: run `python -m bench.report --write`"
    )
