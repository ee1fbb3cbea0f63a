"""Study archive commands, under `baseline study`: archive a study into one checked file, import
one into this home, and write its agent runs as Inspect AI evaluation logs."""

from __future__ import annotations

from pathlib import Path

import click

from baseline.archive.manifest import ArchiveOptions
from baseline.archive.reader import open_archive
from baseline.attempts.snapshots import store_for
from baseline.cli.paths import OutputFile
from baseline.context import Context
from baseline.studies.studies import find_study


def register(cli: click.Group) -> None:
    group = cli.commands.get("study")
    if not isinstance(group, click.Group):
        raise RuntimeError("baseline.cli.core must register `study` before the archive commands")
    for command in (archive, import_archive, inspect_logs):
        group.add_command(command)


@click.command("archive")
@click.argument("study")
@click.argument("out", type=OutputFile())
@click.option("--include-notes", is_flag=True, help="Keep free-text notes (pauses, experts).")
@click.option(
    "--include-recordings", is_flag=True, help="Keep humans' terminal recordings and histories."
)
def archive(study: str, out: Path, include_notes: bool, include_recordings: bool) -> None:
    """Write STUDY (a name or an id) into one archive file OUT (.tar, or .tar.gz)."""
    from analysis.archive import archive_study
    from baseline.archive.export import describe

    if out.exists():
        raise click.ClickException(f"{out} exists; choose a new file")
    ctx = Context.from_settings()
    options = ArchiveOptions(notes=include_notes, recordings=include_recordings)
    with ctx.session() as session:
        result = archive_study(session, store_for(ctx), find_study(session, study), out, options)
    for key, value in describe(result).items():
        click.echo(f"{key}: {value}")


@click.command("import-archive")
@click.argument("archive_path", metavar="ARCHIVE", type=click.Path(path_type=Path))
def import_archive(archive_path: Path) -> None:
    """Check ARCHIVE against its manifest and add its study to this home."""
    from baseline.archive.importer import import_archive as run_import

    ctx = Context.from_settings()
    with open_archive(archive_path) as opened, ctx.session() as session:
        result = run_import(session, store_for(ctx), opened)
    click.echo(
        f"imported study {result.study_id} {result.study_name!r}: "
        f"{result.rows} rows, {result.blobs} blobs"
    )


@click.command("inspect-logs")
@click.argument("study")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
def inspect_logs(study: str, out_dir: Path) -> None:
    """Write STUDY's agent attempts as Inspect AI evaluation logs (one per task) into OUT_DIR."""
    from analysis.inspect_logs import require_inspect, write_inspect_logs

    require_inspect()
    ctx = Context.from_settings()
    with ctx.session() as session:
        written = write_inspect_logs(session, find_study(session, study), out_dir)
    for path in written:
        click.echo(str(path))
