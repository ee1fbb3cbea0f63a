"""Files the commands write: a missing folder is said when the command line is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.baseline.cli.test_cli_infra import run


@pytest.mark.parametrize(
    ("args", "param"),
    [
        (["plot", "1", "--out"], "'--out'"),
        (["export", "1", "--out"], "'--out'"),
        (["study", "archive", "1"], "'OUT'"),
        (["grading", "export", "1", "--out"], "'--out'"),
        (["plan", "--checkpoint", "2:0.2:0.4", "--out"], "'--out'"),
    ],
)
def test_a_file_in_a_missing_folder_is_refused_before_the_work(
    tmp_path: Path, args: list[str], param: str
) -> None:
    """They said "No such file or directory" after the work, a data frame library's message, or
    the name of the temporary file the archive is written to first."""
    missing = tmp_path / "no-such-folder"
    result = run([*args, str(missing / "out.html")], tmp_path / "home")
    assert result.returncode == 2, result
    assert result.stderr.startswith(
        f"error: Invalid value for {param}: its folder {missing} does not exist"
    )
    assert len(result.stderr.strip().splitlines()) == 1 and not missing.exists()
