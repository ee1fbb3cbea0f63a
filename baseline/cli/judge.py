"""Judge commands: `baseline judge-eval` (judge vs expert grades) and `baseline judge run`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from baseline.cli.paths import OutputFile
from scoring.judge import (
    Judge,
    JudgeRun,
    LogFile,
    ReproductionRecord,
    SubmissionView,
    TaskMaterials,
)
from scoring.judge.engine import token_usage
from scoring.judge.submission import reproduction_from_directory
from scoring.judge_eval import PUBLISHED_F1, evaluate, format_table, published_line
from scoring.llm import JudgeConfig, ModelPrice
from scoring.rubric import Rubric, RubricError
from scoring.rubric_graded import GradedTree, graded_tree, graded_variant

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
    max_prior_nodes: int | None = None,
    requests_per_minute: float | None = None,
    tokens_per_minute: float | None = None,
    file_char_limit: int = 200_000,
    notebooks_as_code: bool = False,
    log_token_budget: int | None = None,
    log_tail_share: float = 0.0,
    rank_batch_size: int = 20,
    rank_with_paper: bool = False,
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
            max_prior_nodes=max_prior_nodes,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            file_char_limit=file_char_limit,
            notebooks_as_code=notebooks_as_code,
            log_token_budget=log_token_budget,
            log_tail_share=log_tail_share,
            rank_batch_size=rank_batch_size,
            rank_with_paper=rank_with_paper,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise click.ClickException(
            f"bad judge setting {where}: {message}" if where else message
        ) from exc


def _judge_option_list(required: bool) -> tuple[Callable[[Any], Any], ...]:
    return (
        click.option("--base-url", required=required, help="An OpenAI-compatible endpoint (…/v1)."),
        click.option("--model", required=required, help="The model's name at the endpoint."),
        click.option(
            "--api-key-env",
            default="OPENAI_API_KEY",
            show_default=True,
            help="The environment variable holding the API key (the key itself is never stored).",
        ),
        click.option(
            "--reasoning-effort",
            type=click.Choice(["minimal", "low", "medium", "high"]),
            help="For reasoning models (default: the model's own).",
        ),
        click.option(
            "--context-tokens",
            type=int,
            default=128_000,
            show_default=True,
            help="The model's context window: the paper, files and log shown are cut to fit it.",
        ),
        click.option(
            "--concurrency",
            type=int,
            default=32,
            show_default=True,
            help="Calls to the endpoint at once.",
        ),
        click.option(
            "--price-in", type=float, help="USD per million input tokens (unlisted models)."
        ),
        click.option("--price-out", type=float, help="USD per million output tokens."),
        click.option(
            "--max-prior-nodes",
            type=int,
            help="Show only the last N preceding criteria per leaf (PaperBench: 5 for pinn).",
        ),
        click.option("--rpm", "requests_per_minute", type=float, help="The key's request limit."),
        click.option("--tpm", "tokens_per_minute", type=float, help="The key's token limit."),
        click.option(
            "--file-char-limit",
            type=int,
            default=200_000,
            show_default=True,
            help="Characters of a file the judge reads (PaperBench: 200,000).",
        ),
        click.option(
            "--notebooks-as-code",
            is_flag=True,
            help="Offer Jupyter notebooks to leaves as code (PaperBench does not).",
        ),
        click.option(
            "--log-token-budget",
            type=int,
            help="Tokens of the reduced reproduce.log a leaf sees. Default: half of "
            "--context-tokens (PaperBench).",
        ),
        click.option(
            "--log-tail-share",
            type=float,
            default=0.0,
            show_default=True,
            help="Share of the log budget kept from the log's end, where errors and final "
            "metrics are (PaperBench: 0, the head only).",
        ),
        click.option(
            "--rank-batch-size",
            type=int,
            default=20,
            show_default=True,
            help="Leaves whose files one ranking call orders (PaperBench: 1, a call per leaf).",
        ),
        click.option(
            "--rank-with-paper",
            is_flag=True,
            help="Show the paper and addenda in the ranking prompt, cut to fit (PaperBench does).",
        ),
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
    "max_prior_nodes",
    "requests_per_minute",
    "tokens_per_minute",
    "file_char_limit",
    "notebooks_as_code",
    "log_token_budget",
    "log_tail_share",
    "rank_batch_size",
    "rank_with_paper",
)


def _with_options(
    command: Callable[..., None], required: bool, build: Callable[..., JudgeConfig | None]
) -> Callable[..., None]:
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        settings = [kwargs.pop(name) for name in _JUDGE_PARAMS]
        command(*args, config=build(*settings), **kwargs)

    decorated: Callable[..., None] = wrapper
    for option in reversed(_judge_option_list(required)):
        decorated = option(decorated)
    return decorated


def judge_options(command: Callable[..., None]) -> Callable[..., None]:
    """The judge settings as command-line options; the command receives them as one `config`."""
    return _with_options(command, True, judge_config)


def _optional_config(base_url: str | None, model: str | None, *rest: Any) -> JudgeConfig | None:
    if base_url is None and model is None:
        return None
    if base_url is None or model is None:
        raise click.ClickException("give both --base-url and --model to grade with a judge")
    return judge_config(base_url, model, *rest)


def optional_judge_options(command: Callable[..., None]) -> Callable[..., None]:
    """As :func:`judge_options`, but `config` is None when no endpoint is given."""
    return _with_options(command, False, _optional_config)


@click.command("judge-eval")
@click.option("--gold", type=click.Path(path_type=Path), required=True, help="Expert-graded tree.")
@click.option("--pred", type=click.Path(path_type=Path), help="Judge-graded tree to compare.")
@click.option(
    "--paper",
    type=click.Path(path_type=Path),
    help="Grade the case instead: a paper folder (paper.md, addendum.md, judge.addendum.md).",
)
@click.option(
    "--submission",
    type=click.Path(path_type=Path),
    help="The case's submission folder (reproduce.sh, reproduce.log and what it produced).",
)
@click.option("--out", type=OutputFile(), help="Write the judge's graded tree here.")
@optional_judge_options
@click.option(
    "--invalid-as-zero",
    is_flag=True,
    help="Count a leaf the judge left invalid or ungraded as a judge 0 (default: left out and "
    "counted, as PaperBench does).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
def judge_eval(
    gold: Path,
    pred: Path | None,
    paper: Path | None,
    submission: Path | None,
    out: Path | None,
    config: JudgeConfig | None,
    invalid_as_zero: bool,
    as_json: bool,
) -> None:
    """Compare a judge's leaf grades with expert grades of the same rubric.

    Either compare a graded tree (--pred), or grade a JudgeEval-style case with a judge (--paper,
    --submission and the judge settings) and compare that; F1 is printed beside PaperBench's
    published figures, so a model can be measured before it is trusted.
    """
    gold_tree = _load_tree(gold, "gold")
    grading = paper is not None or submission is not None or config is not None
    if pred is not None and grading:
        raise click.ClickException("give either --pred, or --paper, --submission and a judge")
    run = None
    if pred is not None:
        pred_tree = _load_tree(pred, "pred")
    elif paper is None or submission is None or config is None:
        raise click.ClickException(
            "give --pred, or --paper, --submission, --base-url and --model to grade the case"
        )
    else:
        run = _grade_case(gold_tree, paper, submission, config)
        pred_tree = graded_tree(gold_tree.rubric, run.grades())
        if out is not None:
            pred_tree.save(out)
    try:
        result = evaluate(gold_tree, pred_tree, invalid_as_zero=invalid_as_zero)
    except RubricError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        data = result.to_obj()
        if run is not None:
            data["run"] = _run_summary(run)
        data["published_f1"] = PUBLISHED_F1
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(format_table(result))
    if run is not None:
        summary = _run_summary(run)
        click.echo(
            f"judge run: {summary['calls']} model calls ({summary['calls_per_leaf']:.3f} per "
            f"leaf, {summary['failed_calls']} failed attempts), ${summary['cost_usd']:.4f} in "
            f"all (ranking included); {summary['invalid_leaves']} leaves invalid"
        )
    click.echo(f"overall F1 {result.overall.f1:.3f}; {published_line()}")


def _grade_case(gold: GradedTree, paper: Path, submission: Path, config: JudgeConfig) -> JudgeRun:
    """Grade a JudgeEval case's submission against the expert tree's rubric."""
    paper_md = paper / "paper.md"
    if not paper_md.is_file():
        raise click.ClickException(f"no paper text at {paper_md}")
    materials = case_materials(paper_md, [paper])
    view = reproduced_submission(submission)
    return Judge(config).grade(gold.rubric, materials, view)


def case_materials(
    paper_md: Path,
    folders: Sequence[Path],
    addendum: Path | None = None,
    judge_addendum: Path | None = None,
) -> TaskMaterials:
    """The paper and both addenda, as PaperBench always shows them: each addendum given, else
    the first ``addendum.md`` (``judge.addendum.md``) found in `folders`. `judge run` and
    `judge-eval` both read a case through this, so the same folders give the same prompts."""
    return TaskMaterials(
        paper=_read_text(paper_md, "paper"),
        addendum=_addendum(addendum, "addendum.md", folders, "addendum"),
        judge_addendum=_addendum(judge_addendum, "judge.addendum.md", folders, "judge addendum"),
    )


def reproduced_submission(
    folder: Path,
    *,
    log: Path | None = None,
    exit_code: int | None = None,
    changed: Sequence[str] = (),
    hint: str = "",
) -> SubmissionView:
    """A submission folder with its reproduction, as PaperBench reads it: the folder's own
    reproduce.log, and the files modified since it started as produced by it. What is given
    replaces its part only (a log recorded elsewhere, the produced files, the exit code): giving
    an exit code must not make the judge forget the folder's log. Said on stderr, so a grading
    never uses, or misses, a reproduction silently. Both judge commands read a folder this way.
    """
    if not folder.is_dir():
        raise click.ClickException(f"not a directory: {folder}")
    found = reproduction_from_directory(folder)
    record = found
    if log is not None or changed or exit_code is not None:
        if log is not None:
            _check_readable(log, "log")
        own_log = found.log_file if found is not None else None
        own_changed = found.changed_files if found is not None else frozenset()
        record = ReproductionRecord(
            log_file=LogFile(log) if log is not None else own_log,
            exit_code=exit_code,
            changed_files=frozenset(changed) if changed else own_changed,
        )
    if record is None:
        click.echo(f"no reproduce.log in {folder}: graded as not reproduced{hint}", err=True)
    else:
        where = log or (folder / "reproduce.log" if found else "none")
        status = "" if exit_code is None else f", exit code {exit_code}"
        click.echo(
            f"reproduction: log {where}, {len(record.changed_files)} files produced by it{status}",
            err=True,
        )
    return SubmissionView.from_directory(folder, record)


def _run_summary(run: JudgeRun) -> dict[str, Any]:
    leaves = len(run.results)
    return {
        "calls": len(run.calls),
        "calls_per_leaf": len(run.calls) / leaves if leaves else 0.0,
        "failed_calls": sum(1 for c in run.calls if not c.ok),
        "cost_usd": run.cost_usd,
        "prompt_tokens": sum(c.prompt_tokens for c in run.calls),
        "completion_tokens": sum(c.completion_tokens for c in run.calls),
        "invalid_leaves": len(run.invalid),
    }


def _addendum(given: Path | None, name: str, folders: Sequence[Path], what: str) -> str:
    """The addendum given, else the first file `name` in `folders` (PaperBench always shows
    both addenda), said on stderr so that a grading never uses, or misses, one silently."""
    if given is not None:
        return _read_text(given, what)
    places = list(dict.fromkeys(folder / name for folder in folders))
    for path in places:
        if path.is_file():
            click.echo(f"{what}: {path}", err=True)
            return _read_text(path, what)
    click.echo(f"{what}: none (no {' or '.join(map(str, places))})", err=True)
    return ""


@click.group()
def judge() -> None:
    """Grade submissions with the LLM judge."""


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def _check_readable(path: Path, what: str) -> None:
    """One line, not a traceback mid-grading, when a file the judge reads later cannot be read."""
    try:
        path.open("rb").close()
    except OSError as exc:
        raise click.ClickException(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


@judge.command("run")
@click.option(
    "--rubric",
    "rubric_path",
    type=click.Path(path_type=Path),
    required=True,
    help="A PaperBench rubric.json.",
)
@click.option("--submission", type=click.Path(path_type=Path), required=True, help="A directory.")
@click.option("--paper", type=click.Path(path_type=Path), help="Default: paper.md by the rubric.")
@click.option(
    "--addendum",
    type=click.Path(path_type=Path),
    help="Default: addendum.md by the paper, else by the rubric.",
)
@click.option(
    "--judge-addendum",
    type=click.Path(path_type=Path),
    help="Default: judge.addendum.md by the paper, else by the rubric.",
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path),
    help="reproduce.log to use. Default: the submission's own reproduce.log (as PaperBench "
    "reads it).",
)
@click.option("--exit-code", type=int, help="Exit code of the reproduction.")
@click.option(
    "--changed",
    multiple=True,
    help="A path the reproduction produced (repeatable). Default: the files modified since the "
    "submission's reproduce.log was started (as PaperBench reads them).",
)
@click.option(
    "--code-dev",
    is_flag=True,
    help="Grade Code Development leaves only; writes the pruned tree (PaperBench's code_only()).",
)
@click.option("--strict", is_flag=True, help="Refuse a rubric with problems PaperBench accepts.")
@judge_options
@click.option("--out", type=OutputFile(), required=True, help="Graded tree to write.")
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
    view = reproduced_submission(
        submission,
        log=log_path,
        exit_code=exit_code,
        changed=changed,
        hint=" (give --log and --changed for a reproduction recorded elsewhere)",
    )
    materials = case_materials(paper, [paper.parent, rubric_path.parent], addendum, judge_addendum)
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
