"""The workspace's `task` command without a portal: usage, and clear one-line refusals."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from infra.image_build import TASK_CLI


def _cli(config: Path) -> Any:
    """The `task` script loaded as a module (typed Any: its names are set and read here)."""
    spec = importlib.util.spec_from_file_location("task_cli", TASK_CLI)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CONFIG = config
    return module


def test_usage_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = _cli(tmp_path / "missing.json")
    assert cli.main([]) == 2 and "task status" in capsys.readouterr().out
    assert cli.main(["status"]) == 1
    assert "no attempt credentials" in capsys.readouterr().err
    assert cli.main(["dance"]) == 1 and "unknown command 'dance'" in capsys.readouterr().err
    config = tmp_path / "task.json"
    config.write_text(json.dumps({"attempt_id": 1, "token": "bat_x", "url": "http://127.0.0.1:9"}))
    cli.CONFIG = config
    assert cli.main(["note"]) == 1 and "usage: task note TEXT" in capsys.readouterr().err
    assert cli.main(["status"]) == 1 and "cannot reach the portal" in capsys.readouterr().err
    assert cli.main(["submit"]) == 1 and "--yes" in capsys.readouterr().err  # no terminal
