"""What a leaf's prompt is built from, against SimpleJudge's rules applied to the same folder.

The oracle below restates PaperBench's SimpleJudge (``judge/simple.py``: ``_get_whitelisted_files``,
``_truncate_input``; ``judge/utils.py``: ``SIZE_LIMIT_BYTES``, ``sanitize_line``, ``reduce_log``)
from its published code, independently of Baseline's modules, and reads the submission as
PaperBench does: from disk, with modification times against ``reproduce.log.creation_time``.
Baseline must show the same files, the same file texts and the same reduced log, except for the
differences `scoring/judge/README.md` lists: ``reproduce.sh`` is not a candidate outside Code-Dev
mode (the prompt shows it anyway), and the log carries a mark where it was cut.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig

from scoring.judge import Judge, SubmissionView, TaskMaterials
from scoring.judge.engine import _Setup
from scoring.judge.logs import CUT_MARK
from scoring.judge.selection import candidate_files
from scoring.judge.submission import reproduction_from_directory
from scoring.llm import Tokenizer
from scoring.rubric import TaskCategory
from tests.scoring.judge_support import config

# --- the oracle: SimpleJudge's rules ----------------------------------------------------------

_BLACKLIST = {"venv", ".venv", ".env", "wandb", ".egg-info", ".git", ".github", "__pycache__",
              "node_modules"}  # fmt: skip
_DOCS = {".md", ".txt", ".rst"}
_CODE = {".py", ".R", ".Rmd", ".m", ".jl", ".c", ".h", ".cpp", ".hpp", ".cc", ".cxx", ".hxx",
         ".java", ".js", ".ts", ".scala", ".go", ".rs", ".sh", ".config", ".cfg", ".json",
         ".yaml", ".yml", ".toml", ".ini"}  # fmt: skip
_TABLES = {".csv", ".tsv", ".psv", ".json", ".jsonl", ".html", ".xml", ".yaml", ".yml", ".toml",
           ".arff", ".tex", ".svm", ".libsvm"}  # fmt: skip


def simplejudge_files(root: Path, category: str, started: float) -> set[str]:
    allowed = {"Result Analysis": _DOCS | _TABLES, "Subtree": _DOCS | _CODE | _TABLES}.get(
        category, _DOCS | _CODE
    )
    found = set()
    for dirpath, _, names in os.walk(root):
        if any(b in part for b in _BLACKLIST for part in Path(dirpath).relative_to(root).parts):
            continue
        for name in names:
            path = Path(dirpath) / name
            if path.suffix not in allowed:
                continue
            late = path.stat().st_mtime >= started
            if category == "Result Analysis" and not (path.suffix in _DOCS or late):
                continue
            if category == "Subtree" and not (path.suffix in _DOCS | _CODE or late):
                continue
            found.add(path.relative_to(root).as_posix())
    return found


def simplejudge_log(text: str, context_tokens: int) -> str:
    def sanitize(line: str) -> str:
        line = re.sub(r"\d{4}-\d{2}-\d{2}T[0-9:.]+Z", "<TIMESTAMP>", line)
        line = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", "<DATE>", line)
        line = re.sub(r"\b\d{2}:\d{2}:\d{2}\b", "<TIME>", line)
        if (
            re.search(r"\d+%?\|[█=]+", line)
            or re.search(r"[KMG]?B/s", line)
            or re.search(r"\d+%\s*\|", line)
            or re.search(r"[▏▎▍▌▋▊▉]{2,}", line)
        ):
            line = "<PROGRESS_BAR>"
        line = re.sub(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", "<IP>", line)
        return re.sub(r"\b[0-9a-fA-F]{8,}\b", "<HEX>", line)

    miner = TemplateMiner(config=TemplateMinerConfig())
    out: list[str] = []
    previous, repeats = None, 1
    for line in text.splitlines():
        cluster = miner.add_log_message(sanitize(line))["cluster_id"]
        if previous is None:
            out.append(line)
            previous = cluster
            continue
        if cluster == previous:
            repeats += 1
        else:
            if repeats > 1:
                out.append(f"  (repeated {repeats} times)")
            out.append(line)
            repeats, previous = 1, cluster
    if previous is not None and repeats > 1:
        out.append(f"  (repeated {repeats} times)")
    # tiktoken's decode(encode(text)[:n]); Tokenizer.head is that for text of any length
    return Tokenizer().head("\n".join(out), context_tokens // 2)


# --- a submission folder as an agent leaves it -------------------------------------------------


def _folder(root: Path, log_lines: int) -> float:
    started = 1_700_000_000.0
    before = {
        "README.md": "# Reproduction\n\nRun reproduce.sh.\n",
        "reproduce.sh": "#!/bin/bash\npython src/train.py\n",
        "src/train.py": "import torch\n" + "x = 1\n" * 40_000,  # 240,000 characters
        "src/model.R": "fit <- lm(y ~ x)\n",
        "src/notes.r": "lowercase suffix: not PaperBench's\n",
        "analysis.ipynb": '{"cells": []}\n',
        "paper_notes.tex": "\\section{Old}\n",
        "old_results.csv": "a,b\n1,2\n",
        "wandb/run-1/config.yaml": "lr: 0.1\n",
        ".github/workflows/ci.yml": "on: push\n",
        "tools_venv/helper.py": "x = 1\n",
        "configs/base.yaml": "epochs: 3\n",
    }
    after = {
        "results/metrics.csv": "epoch,acc\n1,0.5\n",
        "results/summary.json": '{"acc": 0.5}\n',
        "results/table.tex": "\\begin{tabular}\\end{tabular}\n",
        "results/plot.png": "not text but named as an image\n",
        "RESULTS.md": "Accuracy 0.5\n",
    }
    lines = []
    for i in range(log_lines):
        lines.append(f"2025-01-28T18:47:{i % 60:02d}.1Z epoch {i} loss {1 / (i + 1):.5f}")
        lines.append(f"{i % 101}%|{'█' * (i % 10)}| {i}/100 [00:01<00:02, 3.2MB/s]")
        lines.append(f"checkpoint written to /ckpt/{i:08x}.pt by worker at 10.0.0.{i % 250}")
    after["reproduce.log"] = "\n".join(lines) + "\nFINAL accuracy 0.5\n"
    for files, stamp in ((before, started - 100), (after, started + 10)):
        for path, text in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            os.utime(target, (stamp, stamp))
    (root / "reproduce.log.creation_time").write_text(str(started))
    return started


CATEGORIES = ["Code Development", "Code Execution", "Result Analysis", "Subtree"]


@pytest.mark.parametrize("code_dev", [False, True])
def test_the_same_files_are_offered_as_simplejudge_offers(tmp_path: Path, code_dev: bool) -> None:
    started = _folder(tmp_path, log_lines=50)
    view = SubmissionView.from_directory(tmp_path, reproduction_from_directory(tmp_path))
    for category in CATEGORIES:
        expected = simplejudge_files(tmp_path, category, started)
        if not code_dev:  # listed: shown in its own section outside Code-Dev mode
            expected.discard("reproduce.sh")
        ours = set(candidate_files(view, TaskCategory(category), code_dev=code_dev))
        assert ours == expected, category


@pytest.mark.parametrize("log_lines", [50, 3_000])
def test_the_same_file_texts_and_reduced_log_as_simplejudge(tmp_path: Path, log_lines: int) -> None:
    _folder(tmp_path, log_lines)
    view = SubmissionView.from_directory(tmp_path, reproduction_from_directory(tmp_path))
    context = 8_000
    judge = Judge(config("http://127.0.0.1:9/v1", context_tokens=context))
    setup = _Setup(judge, TaskMaterials(paper="p"), view, code_dev=False)
    for path in candidate_files(view, TaskCategory.SUBTREE):
        # SimpleJudge reads at most SIZE_LIMIT_BYTES (200,000) characters of a file
        assert setup.text(path) == (tmp_path / path).read_text()[:200_000], path
    assert setup.repro is not None and setup.repro.log is not None
    expected = simplejudge_log((tmp_path / "reproduce.log").read_text(), context)
    shown = setup.repro.log
    if shown.endswith(f"\n{CUT_MARK}"):  # listed: the mark where the log was cut
        shown = shown.removesuffix(f"\n{CUT_MARK}")
        assert expected.startswith(shown) and len(expected) - len(shown) < 200
    else:
        assert shown == expected
    assert ("FINAL accuracy 0.5" in shown) is (log_lines == 50)
