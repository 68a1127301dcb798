"""How well search ranks: a labelled set of questions over the project's own documentation.

    python -m bench.search_quality [--docs docs] [--k 3] [--storage both|real|pgvector] [--json]

``docs/`` is indexed as ``connector-sync ingest docs/`` indexes it (an ingestion per file, run
by a worker, with the configured embedder: the built-in hashing one unless
``CONNECTOR_SYNC_EMBEDDER`` says otherwise), then each question of ``search_questions.json`` is
searched with ``Engine.search``. A question is answered by a passage of a file (or one of a
few); a hit answers it when it is a chunk of that file holding that passage. Reported:

- recall@k: the share of questions answered among their first ``k`` hits;
- MRR: the mean of 1 / the rank of the first hit that answers (0 when none of the first 10 does);
- the scores of the hits that answer beside those of the hits ranked above the first 10 that do
  not, and the best score a question about nothing in the documentation gets: whether a score
  tells a good match from a poor one.

It runs on the Postgres of ``DATABASE_URL`` (embeddings as ``real[]`` when it has no pgvector)
and on an embedded Postgres 16 from ``pgserver`` with pgvector, in a database (a directory) of
its own each, removed at the end. ``tests/test_search_quality.py`` runs the same evaluation on
the test database and holds recall@3 to at least 0.8.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import conninfo

from bench.common import (
    BENCH_DIR,
    Column,
    add_json_option,
    console,
    json_mode,
    machine_info,
    machine_line,
    migrate,
    print_json,
    print_table,
    scratch_database,
    settings_for,
)

QUESTIONS = BENCH_DIR / "search_questions.json"
DOCS = BENCH_DIR.parent / "docs"
DEPTH = 10  # hits read per question: MRR counts a first answer up to this rank
# Questions about nothing the documentation holds: the best score they get is what a poor
# match scores.
UNANSWERABLE = (
    "What is the capital of France?",
    "How do I bake sourdough bread at home?",
    "Who won the football world cup?",
)


def normalized(text: str) -> str:
    """Words only, lowercased: a passage as it reads in the Markdown and in a chunk's text."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.casefold()).split())


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[tuple[str, str], ...]  # (file, passage)

    def answered_by(self, file: str, text: str) -> bool:
        words = normalized(text)
        return any(file == f and normalized(p) in words for f, p in self.answers)


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    return [
        Question(q["question"], tuple((a["file"], a["passage"]) for a in q["answers"]))
        for q in json.loads(path.read_text())
    ]


def missing_labels(questions: Sequence[Question], docs: Path = DOCS) -> list[str]:
    """Each labelled passage its file no longer holds (the documentation moved on): the set must
    be labelled again before its numbers mean anything."""
    from sync.documents import DocumentLimits, Extraction, MediaType

    texts: dict[str, str] = {}
    missing = []
    for q in questions:
        for file, passage in q.answers:
            if file not in texts:
                extraction = Extraction(docs / file, MediaType.MARKDOWN, DocumentLimits())
                texts[file] = normalized(" ".join(s.text for s in extraction))
            if normalized(passage) not in texts[file]:
                missing.append(f"{file}: {passage!r} ({q.question})")
    return missing


def index_docs(engine: Any, docs: Path = DOCS) -> int:
    """A workspace holding ``docs``, indexed by a worker of this process; its id."""
    workspace = engine.create_workspace("docs")
    queued = engine.ingest_paths([docs], workspace.id).ingestions
    worker = engine.worker(listen=False)
    try:
        while worker.poll():
            pass
    finally:
        worker.close()
    ended = [engine.ingestion(i.id) for i in queued]
    failed = [i.file for i in ended if i.status != "ready"]
    if failed:
        raise RuntimeError(f"these files were not indexed: {', '.join(failed)}")
    return int(workspace.id)


@dataclass
class Answer:
    question: str
    rank: int | None  # of the first hit that answers, from 1; None: not among the first 10
    score: float | None  # that hit's
    top: float  # the first hit's score
    others: list[float] = field(default_factory=list)  # hits above the first answer, and all


def evaluate(engine: Any, workspace_id: int, questions: Sequence[Question]) -> list[Answer]:
    answers = []
    for q in questions:
        hits = list(engine.search(q.question, workspace_id, limit=DEPTH))
        rank = next(
            (n for n, h in enumerate(hits, 1) if q.answered_by(h.document_name, h.text)), None
        )
        answers.append(
            Answer(
                q.question,
                rank,
                hits[rank - 1].score if rank else None,
                hits[0].score if hits else 0.0,
                [h.score for n, h in enumerate(hits, 1) if n != rank],
            )
        )
    return answers


def best_unanswerable(engine: Any, workspace_id: int) -> float:
    scores = [h.score for q in UNANSWERABLE for h in engine.search(q, workspace_id, limit=1)]
    return max(scores, default=0.0)


def summary(answers: Sequence[Answer], k: int) -> dict[str, float]:
    found = [a.score for a in answers if a.score is not None]
    others = [s for a in answers for s in a.others]
    return {
        "questions": len(answers),
        f"recall_at_{k}": sum(1 for a in answers if a.rank and a.rank <= k) / len(answers),
        "mrr": sum(1 / a.rank for a in answers if a.rank) / len(answers),
        "answer_score_median": statistics.median(found) if found else 0.0,
        "other_score_median": statistics.median(others) if others else 0.0,
    }


def _pgserver(directory: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        import pgserver

        return pgserver.get_server(directory / "pgdata", cleanup_mode="delete")


def _run(url: str, storage: str, docs: Path, questions: list[Question], k: int) -> dict[str, Any]:
    from sync import Engine

    migrate(url)
    with Engine(settings_for(url), pool_size=3) as engine:
        workspace = index_docs(engine, docs)
        answers = evaluate(engine, workspace, questions)
        poor = best_unanswerable(engine, workspace)
    result = {"storage": storage, **summary(answers, k), "unanswerable_best_score": poor}
    console.print(
        f"  {storage:22} recall@{k} {result[f'recall_at_{k}']:.2f}  MRR {result['mrr']:.2f}"
    )
    result["answers"] = answers
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, default=DOCS, help="the Markdown files to index")
    parser.add_argument("--k", type=int, default=3, help="recall@k")
    parser.add_argument("--storage", choices=("both", "real", "pgvector"), default="both")
    add_json_option(parser)
    args = parser.parse_args()
    json_mode(args)
    questions = load_questions()
    missing = missing_labels(questions, args.docs)
    if missing:
        raise SystemExit("labels no longer in the documentation:\n" + "\n".join(missing))
    console.print(f"[bold]bench.search_quality[/bold]: {len(questions)} questions")
    results = []
    with scratch_database("search_quality") as plain:
        machine = machine_info(plain)
        console.print(machine_line(machine))
        if args.storage in ("both", "real"):
            results.append(_run(plain, "real[] (Postgres 15)", args.docs, questions, args.k))
    if args.storage in ("both", "pgvector"):
        directory = Path(tempfile.mkdtemp(prefix="bench-search-quality-"))
        server = _pgserver(directory)
        try:
            url = conninfo.make_conninfo(server.get_uri("postgres"))
            results.append(_run(url, "pgvector 0.6 (16)", args.docs, questions, args.k))
        finally:
            server.cleanup()
            shutil.rmtree(directory, ignore_errors=True)
    print_table(
        f"Search quality: {len(questions)} questions over docs/ (hashing embedder unless set)",
        [
            Column("storage", "left"),
            f"recall@{args.k}",
            "MRR",
            "answer score (median)",
            "other hits (median)",
            "unanswerable (best)",
        ],
        [
            [
                r["storage"],
                f"{r[f'recall_at_{args.k}']:.2f}",
                f"{r['mrr']:.2f}",
                f"{r['answer_score_median']:.3f}",
                f"{r['other_score_median']:.3f}",
                f"{r['unanswerable_best_score']:.3f}",
            ]
            for r in results
        ],
    )
    first = results[0]["answers"]
    print_table(
        f"Per question ({results[0]['storage']})",
        [Column("question", "left"), "rank", "score", "top score"],
        [
            [a.question, a.rank or "-", f"{a.score:.3f}" if a.score else "-", f"{a.top:.3f}"]
            for a in first
        ],
    )
    print_json("search_quality", args, results, machine=machine)


if __name__ == "__main__":
    main()
