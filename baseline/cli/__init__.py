"""The `baseline` command line.

Each area registers its commands from its own module (listed in COMMAND_MODULES) so this file
stays the single entry point. Every expected failure ends as one line on stderr and exit code 1;
usage errors exit 2 (click's convention); no traceback reaches the user.
"""

from __future__ import annotations

import importlib
import sys

import click
from sqlalchemy.exc import OperationalError, ProgrammingError

from baseline.config import ConfigError
from baseline.errors import DomainError

COMMAND_MODULES = (
    "baseline.cli.core",
    "baseline.cli.analysis",
    "baseline.cli.planning",
    "baseline.cli.judge",
    "baseline.cli.tasks",
    "baseline.cli.infra",
    "baseline.cli.snapshots",
    "baseline.cli.launch",
    "baseline.cli.scoring",
    "baseline.cli.hub",
    "baseline.cli.agents",
    "baseline.cli.archive",  # adds to core's `study` group
    "baseline.cli.monitor",  # adds `watch` to core's `study` group
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="baseline")
def cli() -> None:
    """Baseline: run human-vs-AI baseline studies for AI R&D evaluations."""


for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(cli)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="baseline", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "baseline"
        click.echo(f"error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (DomainError, ConfigError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except (OperationalError, ProgrammingError) as exc:
        reason = str(exc.orig).splitlines()[0] if exc.orig else str(exc)
        click.echo(
            f"error: database problem ({reason}); run `baseline init` or `baseline db upgrade`",
            err=True,
        )
        sys.exit(1)
    except OSError as exc:
        click.echo(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(1)
