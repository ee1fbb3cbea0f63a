"""Task and rubric commands: import and list tasks, check rubric files, score graded trees."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from baseline.context import Context
from baseline.tasks import expbench, tasks
from infra.blobs import BlobStore
from scoring import task_standard_normalisation as normalisation
from scoring.rubric import Rubric, RubricError
from scoring.rubric_graded import GradedTree
from scoring.rubric_scores import Convention, TreeScore

CATEGORIES = ("Code Development", "Code Execution", "Result Analysis")
F = TypeVar("F", bound=Callable[..., Any])


def register(cli: click.Group) -> None:
    cli.add_command(task)
    cli.add_command(rubric)


def _missing_files_option(name: str, help_text: str) -> Callable[[F], F]:
    """The choice, for `task import` and `task check-expbench` alike, of what an EXP-Bench
    question naming a file its repository lacks does to its paper."""
    return click.option(
        name,
        type=click.Choice([m.value for m in expbench.MissingFiles]),
        default=expbench.MissingFiles.SKIP.value,
        show_default=True,
        help=help_text,
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@click.group()
def task() -> None:
    """Import and list tasks."""


@task.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Task Standard family's normalisation setting, e.g. starting_score=corrupted_loss "
    "(keys as in its baseline_scoring.yaml; repeatable).",
)
@_missing_files_option(
    "--expbench-missing-files",
    "An EXP-Bench question naming a file its repository lacks: skip it and report it (as "
    "EXP-Bench does), or refuse the whole paper.",
)
def task_import(
    paths: tuple[Path, ...], as_json: bool, settings: tuple[str, ...], expbench_missing_files: str
) -> None:
    """Import task folders (PaperBench paper folders, scored-task folders, EXP-Bench papers,
    METR Task Standard family folders)."""
    try:
        family_settings = normalisation.parse_set(list(settings)) if settings else None
    except normalisation.NormalisationError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx = Context.from_settings()
    blobs = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        imported = tasks.import_tasks(
            session,
            blobs,
            paths,
            family_settings=family_settings,
            expbench_missing_files=expbench.MissingFiles(expbench_missing_files),
        )
        results = [r.counts() for r in imported]
    if as_json:
        click.echo(json.dumps({"tasks": results}, indent=2))
        return
    for row in results:
        state = "imported" if row["created"] else "unchanged"
        visibility = ", ".join(f"{n} {v}" for v, n in sorted(row["files_by_visibility"].items()))
        leaves = f", {row['leaves']} leaves" if row["leaves"] is not None else ""
        click.echo(
            f"{state:<9} {row['slug']} [{row['kind']}] {row['files']} files ({visibility}){leaves}"
        )
        if row["skipped"]:
            click.echo(f"          not imported: {', '.join(row['skipped'])}")
        for warning in row["warnings"]:
            click.echo(f"          warning: {warning}")
    created = sum(1 for row in results if row["created"])
    click.echo(f"{len(results)} tasks: {created} imported, {len(results) - created} unchanged")


@task.command("check-expbench")
@click.argument("release", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@_missing_files_option(
    "--missing-files",
    "A question naming a file its repository lacks: skip it and report it (as EXP-Bench "
    "does), or refuse the whole paper (as `task import --expbench-missing-files`).",
)
def task_check_expbench(release: Path, as_json: bool, missing_files: str) -> None:
    """Check every EXP-Bench paper under RELEASE as `task import` would read it (nothing is
    stored): per paper, imports (its questions by kind, and each question skipped with its
    reason) or refused, with every error. Exits 1 when a paper is refused, so a script can
    tell."""
    checks = expbench.check_release(release, expbench.MissingFiles(missing_files))
    if as_json:
        rows = [
            {
                "folder": str(c.folder),
                "imports": c.imports,
                "kinds": c.kinds,
                "skipped_questions": c.skipped_questions,
                "errors": c.errors,
            }
            for c in checks
        ]
        click.echo(json.dumps({"papers": rows}, indent=2))
    else:
        for check in checks:
            name = check.folder.relative_to(release).as_posix() if check.folder != release else "."
            if check.imports:
                kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(check.kinds.items()))
                click.echo(
                    f"imports  {name}: {sum(check.kinds.values())} questions ({kinds}), "
                    f"{len(check.skipped_questions)} skipped"
                )
                for note in check.skipped_questions:
                    click.echo(f"         {note}")
                continue
            click.echo(f"refused  {name}: {len(check.errors)} error(s)")
            for error in check.errors:
                click.echo(f"         {error}")
        good = [c for c in checks if c.imports]
        questions = sum(sum(c.kinds.values()) for c in good)
        skipped = sum(len(c.skipped_questions) for c in good)
        click.echo(
            f"{_count(len(checks), 'paper')}: {len(good)} import "
            f"({_count(questions, 'question')}, {skipped} skipped), "
            f"{len(checks) - len(good)} refused"
        )
    if not checks or any(not c.imports for c in checks):
        sys.exit(1)


@task.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
def task_list(as_json: bool) -> None:
    """List imported tasks."""
    with Context.from_settings().session() as session:
        rows = [
            {
                "id": t.id,
                "slug": t.slug,
                "title": t.title,
                "kind": t.kind.value,
                "files": len(t.files),
                "leaves": t.summary.get("leaves"),
                "content_hash": t.content_hash,
            }
            for t in tasks.list_tasks(session)
        ]
    if as_json:
        click.echo(json.dumps({"tasks": rows}, indent=2))
        return
    if not rows:
        click.echo("no tasks")
    for row in rows:
        leaves = f"  {row['leaves']} leaves" if row["leaves"] is not None else ""
        click.echo(f"{row['id']:>4}  {row['slug']}  [{row['kind']}]  {row['files']} files{leaves}")


@click.group()
def rubric() -> None:
    """Check rubric files and score graded trees."""


def _load_rubric(path: Path) -> Rubric:
    try:
        rubric = Rubric.load(path)
    except RubricError as exc:
        raise click.ClickException(str(exc)) from exc
    for issue in rubric.warnings:  # what PaperBench accepts but a careful author would fix
        click.echo(f"warning: {path}: {issue}", err=True)
    return rubric


@rubric.command("stats")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
def rubric_stats(paths: tuple[Path, ...], as_json: bool) -> None:
    """Leaves, nodes and leaves by category, per rubric file and in total."""
    files = {str(path): _load_rubric(path).stats().to_obj() for path in paths}
    total: dict[str, Any] = {"files": len(files), "nodes": 0, "leaves": 0, "duplicate_ids": 0}
    by_category: dict[str, int] = {}
    by_fine: dict[str, int] = {}
    for stats in files.values():
        for key in ("nodes", "leaves", "duplicate_ids"):
            total[key] += stats[key]
        for name, count in stats["leaves_by_category"].items():
            by_category[name] = by_category.get(name, 0) + count
        for name, count in stats["leaves_by_finegrained"].items():
            by_fine[name] = by_fine.get(name, 0) + count
    total["leaves_by_category"] = dict(sorted(by_category.items()))
    total["leaves_by_finegrained"] = dict(sorted(by_fine.items()))
    if as_json:
        click.echo(json.dumps({"files": files, "total": total}, indent=2))
        return
    for name, stats in {**files, "total": total}.items():
        # The three categories always, then any other a rubric has (Subtree, or none given).
        counts = stats["leaves_by_category"]
        shown = [*CATEGORIES, *sorted(set(counts) - set(CATEGORIES))]
        categories = ", ".join(f"{c} {counts.get(c, 0)}" for c in shown)
        click.echo(f"{name}: {stats['leaves']} leaves, {stats['nodes']} nodes ({categories})")


def _score_text(score: TreeScore) -> str:
    if score.score is not None:
        text = f"{score.score:.6f}"
    else:
        text = f"undetermined (between {score.root.lower:.6f} and {score.root.upper:.6f})"
    if score.missing:
        text += f", {score.missing} of {score.root.leaves} leaves missing"
    return text


@rubric.command("score")
@click.argument("graded", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON, not a table.")
@click.option(
    "--paperbench-convention",
    is_flag=True,
    help="Score as PaperBench does: an invalid leaf by the score it stores (0 from a judge), an "
    "ungraded one as 0 (both still reported).",
)
@click.option(
    "--rubric",
    "rubric_path",
    type=click.Path(path_type=Path),
    help="The paper's rubric.json, for fine-grained categories the graded file lacks.",
)
def rubric_score(
    graded: Path, as_json: bool, paperbench_convention: bool, rubric_path: Path | None
) -> None:
    """Score a graded tree (PaperBench graded format): root, categories, invalid leaves."""
    convention = Convention.PAPERBENCH if paperbench_convention else Convention.STRICT
    try:
        tree = GradedTree.load(graded)
        if rubric_path is not None:
            tree = tree.with_rubric(_load_rubric(rubric_path))
    except RubricError as exc:
        raise click.ClickException(str(exc)) from exc
    report = tree.report(convention)
    stored = tree.stored_root_score
    computed = report.overall.score
    if as_json:
        click.echo(
            json.dumps({"file": str(graded), "stored_score": stored, **report.to_obj()}, indent=2)
        )
        return
    click.echo(f"{graded}: score {_score_text(report.overall)}")
    # A file's stored root may follow PaperBench's convention (invalid leaves as stored, as
    # Baseline's judge writes it too): a warning only when it matches neither way of scoring.
    paperbench = tree.report(Convention.PAPERBENCH).overall.score
    if stored is not None and all(
        value is None or abs(stored - value) > 1e-9 for value in (computed, paperbench)
    ):
        click.echo(f"  warning: the file stores {stored} at its root")
    for name, score in report.by_category.items():
        click.echo(f"  {name}: {_score_text(score)}")
    for name, score in report.by_finegrained.items():
        click.echo(f"  {name}: {_score_text(score)}")
    overall = report.overall
    if overall.invalid:
        click.echo(f"  invalid leaves: {', '.join(map(_dotted, overall.invalid))}")
    if overall.ungraded:
        click.echo(f"  ungraded leaves: {', '.join(map(_dotted, overall.ungraded))}")


def _dotted(path: tuple[int, ...]) -> str:
    return ".".join(map(str, path)) or "<root>"
