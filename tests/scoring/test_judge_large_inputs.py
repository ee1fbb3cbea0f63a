"""Real submissions carry large files: predictions, training logs, checkpoints. The judge reads at
most `file_char_limit` characters of a file (PaperBench's 200,000) and tokenises any input in
pieces the tokenizer accepts, so that no file and no log can crash a grading; what was cut is
recorded in the leaf's details. A log on disk is read in bounded pieces, only as far as the
reduction's head needs it."""

from __future__ import annotations

import json
import os
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from baseline.cli import cli
from scoring.judge import Judge, LogFile, ReproductionRecord, SubmissionView
from scoring.judge.logs import _lines, reduce_log
from scoring.llm import Tokenizer
from scoring.rubric import Rubric
from scoring.rubric_graded import GradedTree
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


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_a_log_is_split_into_the_lines_str_splitlines_gives_whatever_the_pieces(size: int) -> None:
    """A log file is read a piece at a time: a line end split across two pieces ("\\r" then
    "\\n"), or a UTF-8 character split across two reads, must not change its lines."""
    rng = random.Random(size)
    alphabet = ["a", "b", " ", "\n", "\r", "\r\n", "\x0b", "\x85", "\u2028", "é", "\U0001f9ea"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for _ in range(3):  # a read can decode to nothing (only part of a UTF-8 character)
            pieces.insert(rng.randrange(len(pieces) + 1), "")
        assert list(_lines(pieces)) == text.splitlines(), repr(text)
    # one line longer than the cap is cut there; the lines after it are whole
    assert list(_lines(["x" * 50, "x" * 50 + "\nnext\n"], max_line_chars=30)) == ["x" * 30, "next"]


def test_a_log_read_from_disk_reduces_as_the_same_log_in_memory(tmp_path: Path) -> None:
    text = _training_log(2 * MB)
    path = tmp_path / "reproduce.log"
    path.write_bytes(text.encode())
    tokenizer = Tokenizer()
    for budget, tail_share in ((2_000, 0.0), (2_000, 0.5), (10**7, 0.0)):
        on_disk = reduce_log(LogFile(path), tokenizer, budget, tail_share)
        assert on_disk == reduce_log(text, tokenizer, budget, tail_share)
    # undecodable bytes are replaced as a whole read would replace them, wherever a read ends
    broken = ("é" * 700_000).encode()[1:] + b"\xff\nok"
    path.write_bytes(broken)
    whole = broken.decode("utf-8", errors="replace")
    assert reduce_log(LogFile(path), tokenizer, 10**7) == reduce_log(whole, tokenizer, 10**7)


def _write(root: Path, files: dict[str, bytes], mtime: float) -> None:
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, (mtime, mtime))


def test_judge_run_grades_a_folder_with_a_5_mb_file_a_50_mb_log_and_a_binary_file(
    tmp_path: Path,
) -> None:
    """The issue's acceptance through `baseline judge run` on a PaperBench submission folder:
    no traceback, every leaf graded, the cuts recorded in the leaves' details, the binary file
    (named as a table the reproduction wrote) never shown, and the 50 MB log read in bounded
    pieces: the whole grading allocates at most 40 MB at any time (it was 130 MB: the log read
    whole, decoded, then split into lines)."""
    sub, started = tmp_path / "sub", 1_700_000_000.0
    before = synthetic_files()
    del before["reproduce.log"]
    _write(sub, before, started - 100)
    preds = _predictions(5 * MB)
    binary = random.Random(5).randbytes(MB)
    _write(sub, {"results/preds.json": preds, "results/weights.json": binary}, started + 10)
    log = _training_log(50 * MB).encode()
    _write(sub, {"reproduce.log": log}, started + 20)
    log_bytes = len(log)
    del log
    (sub / "reproduce.log.creation_time").write_text(str(started))
    paper = tmp_path / "paper.md"
    paper.write_text(materials().paper)
    rubric = tmp_path / "rubric.json"
    rubric.write_text(_rubric().dumps())
    out = tmp_path / "graded.json"
    Tokenizer().count("loaded")  # the BPE tables (about 80 MB, loaded once) are not the log's
    with FakeOpenAI(answer=scripted_answer) as fake:
        tracemalloc.start()
        try:
            result = CliRunner().invoke(
                cli,
                [
                    "judge", "run", "--rubric", str(rubric), "--submission", str(sub),
                    "--paper", str(paper), "--base-url", fake.base_url, "--model", "m",
                    "--price-in", "0", "--price-out", "0", "--context-tokens", "32000",
                    "--out", str(out),
                ],
            )  # fmt: skip
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        shown = "\n".join(json.dumps(r.body["messages"]) for r in fake.requests)
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output
    grades = GradedTree.load(out).grades
    assert len(grades) == 3 and all(g.usable for g in grades.values())
    details = {path: grade.judge_metadata for path, grade in grades.items()}
    result_leaf = next(d for d in details.values() if d["category"] == "Result Analysis")
    cuts = result_leaf["cuts"]
    assert cuts["log"]["bytes"] == log_bytes
    assert 0 < cuts["log"]["kept_chars"] < 100_000
    assert cuts["files"]["results/preds.json"]["chars"] == len(preds)
    assert 0 < cuts["files"]["results/preds.json"]["kept_chars"] <= 200_000
    assert all("results/weights.json" not in d["files"] for d in details.values())
    assert "results/weights.json" not in shown
    assert "[... log cut to fit ...]" in shown
    assert peak < 40 * MB, f"{peak / MB:.0f} MB allocated at the peak"
