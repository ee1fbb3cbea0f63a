"""An EXP-Bench paper folder built on disk in EXP-Bench's format: questions JSON, JSONL metadata,
and a local clone (with its own git history holding the masked file)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

PAPER_ID = "93022"
MASKED_MARKER = "SECRET_MASKED_IMPLEMENTATION_7f3a"
README_MARKER = "README_SAYS_THE_ANSWER_1b2c"


def questions() -> list[dict[str, Any]]:
    return [
        {
            "question": "Does label smoothing improve test accuracy of the small CNN?",
            "method": "Train with and without label smoothing, same seed and budget.",
            "expected_outcome": "Label smoothing improves accuracy by about 1 point.",
            "design_complexity": {
                "constant_variables": ["learning rate 0.1", "epochs 10"],
                "independent_variables": ["label smoothing (0 or 0.1)"],
                "dependent_variables": ["test accuracy"],
            },
            "requirements": [
                "Step 1: implement SmoothedLoss in model.py (model.py:1-20)",
                "Step 2: add a --smoothing flag to train.py (train.py:5)",
            ],
            "agent_instructions": "Implement the loss, then run both configurations.",
            "usage_instructions": "python train.py --smoothing 0.1",
            "source": ["model.py", "train.py"],
            "masked_source": ["model.py"],
            "ambiguity": "low",
        },
        {
            "hypothesis": "Evaluation on the held-out split is stable across seeds.",
            "method": "Run eval.py with three seeds.",
            "expected_outcome": "Accuracy varies by less than 0.5 points.",
            "design_complexity": {
                "constant_variables": ["model checkpoint"],
                "independent_variables": ["seed"],
                "dependent_variables": ["accuracy"],
            },
            "requirements": ["Step 1: run eval.py for seeds 0, 1, 2"],
            "source": ["eval.py"],
        },
        {
            "question": "Is the dataset class-balanced?",
            "method": "Count labels in data/labels.txt.",
            "expected_outcome": "Yes: each class has the same count.",
            "design_complexity": {
                "constant_variables": [],
                "independent_variables": [],
                "dependent_variables": ["class counts"],
            },
            "requirements": [],
        },
    ]


def build(root: Path, questions_obj: Any = None, *, git_history: bool = True) -> Path:
    """The folder `root/<paper>` ready for ``baseline task import``."""
    folder = root / f"paper-{PAPER_ID}"
    repo = folder / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "README.md").write_text(f"# Smoothing\n{README_MARKER}\n")
    (repo / "model.py").write_text(f"class SmoothedLoss:  # {MASKED_MARKER}\n    pass\n")
    (repo / "train.py").write_text("import model\nprint('train')\n")
    (repo / "eval.py").write_text("print('eval')\n")
    (repo / "data" / "labels.txt").write_text("0\n1\n0\n1\n")
    if git_history:
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "upstream"], check=True)
    document = {"questions": questions()} if questions_obj is None else questions_obj
    (folder / f"{PAPER_ID}_complete_final.json").write_text(json.dumps(document, indent=1))
    lines = [
        {"id": "1", "title": "Another paper", "code_url": "https://github.com/x/y"},
        {
            "id": PAPER_ID,
            "title": "Label Smoothing Revisited",
            "code_url": "https://github.com/example/smoothing",
            "pdf_url": "https://openreview.net/pdf?id=abc",
        },
    ]
    (folder / "neurips2024.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return folder
