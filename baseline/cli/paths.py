"""Files the commands write: their folder is checked when the command line is read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


class OutputFile(click.Path):
    """A file to write whose folder must exist: a mistyped folder is said before the work, not
    as an OS error after it (or as the name of the temporary file written beside it)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        folder = Path(os.fsdecode(path)).parent
        if not folder.is_dir():
            self.fail(f"its folder {folder} does not exist", param, ctx)
        return path
