"""Judge commands: `baseline judge-eval` (judge vs expert grades) and `baseline judge run`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from scoring.judge import Judge, ReproductionRecord, SubmissionView, TaskMaterials
from scoring.judge.engine import token_usage
from scoring.judge_eval import evaluate, format_table
from scoring.llm import JudgeConfig, ModelPrice
from scoring.rubric import Rubric, RubricError
from scoring.rubric_graded import GradedTree, graded_variant

JUDGE_TYPE = "baseline"  # the grader output's judge_type


def register(cli: click.Group) -> None:
    cli.add_command(judge_eval)
    cli.add_command(judge)


def _load_tree(path: Path, what: str) -> GradedTree:
    try:
        return GradedTree.load(path)
    except RubricError as exc:
        raise click.ClickException(f"{what}: {exc}") from exc


def judge_config(
    base_url: str,
    model: str,
    api_key_env: str,
    reasoning_effort: str | None,
    context_tokens: int,
    concurrency: int,
    price_in: float | None,
    price_out: float | None,
) -> JudgeConfig:
    """The judge settings given on a command line, or one line saying which one is wrong."""
    if (price_in is None) != (price_out is None):
        raise click.ClickException("give both --price-in and --price-out, or neither")
    price = None
    if price_in is not None and price_out is not None:
        price = ModelPrice(input_usd_per_mtok=price_in, output_usd_per_mtok=price_out)
    try:
        return JudgeConfig(
            base_url=base_url,
            model=model,
            api_key_env=api_key_env,
            reasoning_effort=reasoning_effort,  # type: ignore[arg-type]
            context_tokens=context_tokens,
            concurrency=concurrency,
            price=price,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise click.ClickException(
            f"bad judge setting {where}: {message}" if where else message
        ) from exc


_JUDGE_OPTIONS = (
    click.option("--base-url", required=True, help="An OpenAI-compatible endpoint (…/v1)."),
    click.option("--model", required=True),
    click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True),
    click.option("--reasoning-effort", type=click.Choice(["minimal", "low", "medium", "high"])),
    click.option("--context-tokens", type=int, default=128_000, show_default=True),
    click.option("--concurrency", type=int, default=32, show_default=True),
    click.option("--price-in", type=float, help="USD per million input tokens (unlisted models)."),
    click.option("--price-out", type=float, help="USD per million output tokens."),
)
_JUDGE_PARAMS = (
    "base_url",
    "model",
    "api_key_env",
    "reasoning_effort",
    "context_tokens",
    "concurrency",
    "price_in",
    "price_out",
)


def judge_options(command: Callable[..., None]) -> Callable[..., None]:
    """The judge settings as command-line options; the command receives them as one `config`."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        settings = [kwargs.pop(name) for name in _JUDGE_PARAMS]
        command(*args, config=judge_config(*settings), **kwargs)

    decorated: Callable[..., None] = wrapper
    for option in reversed(_JUDGE_OPTIONS):
        decorated = option(decorated)
    return decorated


@click.command("judge-eval")
@click.option("--gold", type=click.Path(path_type=Path), required=True, help="Expert-graded tree.")
@click.option("--pred", type=click.Path(path_type=Path), required=True, help="Judge-graded tree.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def judge_eval(gold: Path, pred: Path, as_json: bool) -> None:
    """Compare a judge's leaf grades with expert grades of the same rubric."""
    gold_tree = _load_tree(gold, "gold")
    pred_tree = _load_tree(pred, "pred")
    try:
        result = evaluate(gold_tree, pred_tree)
    except RubricError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.to_obj(), indent=2))
    else:
        click.echo(format_table(result))


@click.group()
def judge() -> None:
    """Grade submissions with the LLM judge."""


def _read_text(path: Path | None, what: str) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


@judge.command("run")
@click.option("--rubric", "rubric_path", type=click.Path(path_type=Path), required=True)
@click.option("--submission", type=click.Path(path_type=Path), required=True, help="A directory.")
@click.option("--paper", type=click.Path(path_type=Path), help="Default: paper.md by the rubric.")
@click.option("--addendum", type=click.Path(path_type=Path))
@click.option("--judge-addendum", type=click.Path(path_type=Path))
@click.option("--log", "log_path", type=click.Path(path_type=Path), help="reproduce.log to use.")
@click.option("--exit-code", type=int, help="Exit code of the reproduction.")
@click.option("--changed", multiple=True, help="A path the reproduction produced (repeatable).")
@click.option(
    "--code-dev",
    is_flag=True,
    help="Grade Code Development leaves only; writes the pruned tree (PaperBench's code_only()).",
)
@click.option("--strict", is_flag=True, help="Refuse a rubric with problems PaperBench accepts.")
@judge_options
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Graded tree to write.")
@click.option(
    "--format",
    "out_format",
    type=click.Choice(["tree", "grader-output"]),
    default="tree",
    show_default=True,
    help="The bare graded tree, or PaperBench's grader-output wrapper around it.",
)
def judge_run(
    rubric_path: Path,
    submission: Path,
    paper: Path | None,
    addendum: Path | None,
    judge_addendum: Path | None,
    log_path: Path | None,
    exit_code: int | None,
    changed: tuple[str, ...],
    code_dev: bool,
    strict: bool,
    config: JudgeConfig,
    out: Path,
    out_format: str,
) -> None:
    """Grade a submission directory against a rubric and write the graded tree."""
    try:
        rubric = Rubric.load(rubric_path, strict=strict)
        written = rubric.code_dev() if code_dev else rubric
    except RubricError as exc:
        raise click.ClickException(str(exc)) from exc
    for issue in rubric.warnings:
        click.echo(f"warning: {rubric_path}: {issue}", err=True)
    paper = paper or rubric_path.parent / "paper.md"
    if not paper.is_file():
        raise click.ClickException(f"no paper text at {paper}: give it with --paper")
    if not submission.is_dir():
        raise click.ClickException(f"not a directory: {submission}")
    record = None
    if log_path is not None or changed or exit_code is not None:
        record = ReproductionRecord(
            log=_read_text(log_path, "log"),
            exit_code=exit_code,
            changed_files=frozenset(changed),
        )
    view = SubmissionView.from_directory(submission, record)
    materials = TaskMaterials(
        paper=_read_text(paper, "paper"),
        addendum=_read_text(addendum, "addendum"),
        judge_addendum=_read_text(judge_addendum, "judge addendum"),
    )
    done = 0

    def progress(_: object) -> None:
        nonlocal done
        done += 1
        if done % 100 == 0:
            click.echo(f"{done} leaves graded", err=True)

    run = Judge(config).grade(rubric, materials, view, code_dev=code_dev, on_leaf=progress)
    tree = graded_variant(written, run.grades())
    if out_format == "tree":
        tree.save(out)
    else:
        wrapper = tree.to_grader_output(
            judge_type=JUDGE_TYPE,
            token_usage=token_usage(run.calls),
            extra={
                "baseline_judge_config": config.model_dump(mode="json"),
                "baseline_code_dev": code_dev,
                "baseline_cost_usd": run.cost_usd,
            },
        )
        out.write_text(json.dumps(wrapper, indent=4, ensure_ascii=False), encoding="utf-8")
    invalid = len(run.invalid)
    click.echo(
        f"graded {len(run.results)} leaves ({invalid} invalid) with {len(run.calls)} model calls, "
        f"${run.cost_usd:.4f}; score {tree.score().root.lower:.4f}; wrote {out}"
    )
    if invalid:
        raise click.ClickException(f"{invalid} leaves are invalid: see their explanations in {out}")
