"""Real submissions carry large files: predictions, training logs, checkpoints. The judge reads at
most `file_char_limit` characters of a file (PaperBench's 200,000) and tokenises any input in
pieces the tokenizer accepts, so that no file and no log can crash a grading; what was cut is
recorded in the leaf's details."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest

from scoring.judge import Judge, ReproductionRecord, SubmissionView
from scoring.llm import Tokenizer
from scoring.rubric import Rubric
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import config, materials, scripted_answer, synthetic_files
from tests.scoring.rubric_factory import leaf, node

MB = 1024 * 1024


def _rubric() -> Rubric:
    return Rubric.from_obj(
        node(
            "root",
            leaf("dev", "Code Development"),
            leaf("exec", "Code Execution", fine="Experimental Setup"),
            leaf("result", "Result Analysis", fine="Logging, Analysis & Presentation"),
        )
    )


def _predictions(size: int) -> bytes:
    rows: list[str] = []
    total, rng = 0, random.Random(3)
    while total < size:
        row = json.dumps({"id": len(rows), "pred": [round(rng.random(), 6) for _ in range(8)]})
        rows.append(row)
        total += len(row) + 1
    return ("\n".join(rows) + "\n").encode()


def _training_log(size: int) -> str:
    # Two templates in turn: no run of one template for PaperBench's reduction to collapse. Long
    # lines: the reduction's time goes with the number of lines (about 80 us a line).
    block = "".join(
        f"epoch {step} batch {step * 7} train loss {1 / (step + 1):.8f} accuracy {step % 100}%\n"
        f"saving checkpoint /work/checkpoints/model-{step}.pt to disk after validation with "
        f"{step % 512} samples on device cuda:{step % 8} in {step / 17:.3f} seconds; per-class "
        f"recall {' '.join(f'{(step * c) % 97 / 97:.4f}' for c in range(60))}\n"
        for step in range(5_000)
    )
    half = block * (size // len(block) // 2)
    return half + "FINAL RESULT: accuracy 0.9731\n" + half


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=scripted_answer) as fake:
        yield fake


def test_a_5_mb_file_a_50_mb_log_and_a_binary_file_are_graded_and_the_cuts_recorded(
    server: FakeOpenAI,
) -> None:
    files = synthetic_files()
    files["results/preds.json"] = _predictions(5 * MB)
    files["results/model.bin"] = random.Random(5).randbytes(MB)
    log = _training_log(50 * MB)
    files["reproduce.log"] = log.encode()
    produced = {p for p in files if p.startswith("results/")} | {"reproduce.log"}
    submission = SubmissionView(
        files=files,
        reproduction=ReproductionRecord(log=log, exit_code=0, changed_files=frozenset(produced)),
    )
    # No file budget: the big file would fill the whole context if it were not cut first.
    run = Judge(config(server.base_url, file_token_budget=None)).grade(
        _rubric(), materials(), submission
    )
    assert run.complete, run.invalid
    by_id = {result.leaf_id: result for result in run.results.values()}
    result = by_id["result"]
    assert result.valid
    cuts = result.details()["cuts"]
    assert cuts["log"]["chars"] == len(log) and cuts["log"]["kept_chars"] < 100_000
    assert "log" not in by_id["dev"].cuts  # Code Development leaves do not see the log
    assert "results/preds.json" in result.files
    preds = cuts["files"]["results/preds.json"]
    assert preds["chars"] == len(files["results/preds.json"])
    assert 0 < preds["kept_chars"] <= 200_000
    # The model saw neither whole: every prompt fits the context.
    for request in server.requests:
        prompt = "".join(m["content"] for m in request.body["messages"])
        assert len(prompt) < 32_000 * 8


def test_the_tokenizer_takes_any_length() -> None:
    tokenizer = Tokenizer()
    # A word and its leading space are one piece of the tokenizer's split: the count of many is
    # many times the count of one. One encode call refuses a million characters.
    for unit in (" épsilon", " \U0001f9ea\U0001f52c"):  # an emoji is several tokens
        per_unit = tokenizer.count(unit)
        text = unit * 400_000
        assert tokenizer.count(text) == 400_000 * per_unit
        assert tokenizer.head(text, 5 * per_unit) == unit * 5
        assert tokenizer.tail(text, 5 * per_unit) == unit * 5
        assert tokenizer.head(text, 10**9) == text
        assert tokenizer.tail(text, 10**9) == text
