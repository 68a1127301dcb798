"""Search ranks what answers a question first: the labelled questions about the project's own
documentation (bench/search_questions.json), searched with the built-in hashing embedder after
`docs/` is indexed the way `connector-sync ingest docs/` indexes it. docs/documents.md records
the figures `python -m bench.search_quality` prints."""

from __future__ import annotations

from bench.search_quality import (
    best_unanswerable,
    evaluate,
    index_docs,
    load_questions,
    missing_labels,
    summary,
)
from sync import Engine


def test_every_labelled_passage_is_still_in_the_documentation() -> None:
    questions = load_questions()
    assert len(questions) >= 30
    assert missing_labels(questions) == []


def test_four_questions_in_five_find_their_answer_in_the_first_three_hits(engine: Engine) -> None:
    workspace = index_docs(engine)
    answers = evaluate(engine, workspace, load_questions())
    found = summary(answers, k=3)
    assert found["recall_at_3"] >= 0.8, [(a.question, a.rank) for a in answers]
    assert found["mrr"] >= 0.6
    # A score says how well a hit matches: the answers score well above what a question about
    # nothing in the documentation gets.
    assert found["answer_score_median"] > 2 * best_unanswerable(engine, workspace)
