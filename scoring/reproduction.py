"""Reproduction of a snapshot in a fresh workspace (PaperBench's reproduction step, made exact).

A snapshot is restored into /home/submission of a workspace created for this purpose only (same
image digest and hardware profile as the attempt), ``venv`` and ``.venv`` are removed (they hold
links into the participant's machine), and ``bash reproduce.sh`` runs with the study's time limit.
What is kept, and why:

- ``reproduce.log``, streamed as it is written (``on_output``) and size-capped keeping its head and
  its tail (the start says what ran, the end says how it failed);
- the exit code (PaperBench did not record it), the duration and whether the limit was hit; the
  script runs under a guard (`scoring.guarded_run`) that, when it ends or at the limit, stops and
  kills every process it started (a `setsid` writer, a fork bomb), so the capture holds only what
  was written within the limit; a run that reached the workspace's process limit failed;
- the files before and after with their hashes, so the judge knows which outputs the run produced;
- ``git status`` after the run, with every program the participant's repository could make git
  run (fsmonitor, hooks, filter drivers, system/global config) disabled, after the executed
  directory is captured and within what is left of the time limit, so nothing it does is
  credited to the run;
- the executed directory, captured as a snapshot manifest into the same blob store: unchanged files
  are the same blobs as the input's, so an executed snapshot costs only what the run produced.

PaperBench's *salvage* retries are available, off by default: a run that failed quickly is rerun
from the pristine snapshot with other Python settings (another interpreter as ``python3``, a fresh
venv), and every attempt is recorded. The whole time limit is shared by all attempts.

This module talks to the workspace only through the `WorkspaceBackend` Protocol and never imports
the domain; `reproduce` creates the workspace and always destroys it.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from infra.blobs import BlobStore
from infra.snapshots import (
    EXPORT_ROOT,
    CaptureError,
    Limits,
    Manifest,
    archive_reader,
    capture_archive,
    diff,
    load_manifest,
    tar_file,
)
from infra.workspace import (
    SUBMISSION_DIR,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
)
from scoring import guarded_run
from scoring.failure import RunFacts, classify

REPRODUCE_SCRIPT = "reproduce.sh"
VENV_DIRS = ("venv", ".venv")
DEFAULT_LOG_HEAD_BYTES = 256 * 1024
DEFAULT_LOG_TAIL_BYTES = 3 * 1024 * 1024
GIT_STATUS_MAX_BYTES = 256 * 1024
SETUP_TIMEOUT_S = 300.0
# How long past the limit the engine lets the guard run before it kills it (the guard itself
# stops the run at the limit and sweeps in a moment; this only bounds a guard that was stopped).
GUARD_GRACE_S = 10.0
# git status runs in what is left of the limit, and at least this long (it runs nothing of the
# participant's and comes after the capture, so these seconds cannot produce credited output).
GIT_STATUS_MIN_S = 5.0

OutputSink = Callable[[bytes], None]


class ReproductionError(RuntimeError):
    """The reproduction could not be carried out (workspace or capture failure), as opposed to
    reproduce.sh failing, which is a result."""


class SalvageSetting(BaseModel):
    """One way of running reproduce.sh: which interpreter is ``python3``, and a fresh venv."""

    python: str | None = None  # e.g. "python3.11"; None keeps the image's python3
    make_venv: bool = False

    @property
    def label(self) -> str:
        parts = [f"python3={self.python}" if self.python else "image python3"]
        if self.make_venv:
            parts.append("fresh venv")
        return ", ".join(parts)

    def prelude(self) -> str:
        """Shell run before reproduce.sh to apply this setting."""
        steps: list[str] = []
        if self.python:
            interpreter = shlex.quote(self.python)
            steps += [
                'shim="$(mktemp -d)"',
                f'ln -s "$(command -v {interpreter})" "$shim/python3"',
                f'ln -s "$(command -v {interpreter})" "$shim/python"',
                'export PATH="$shim:$PATH"',
            ]
        if self.make_venv:
            steps += ["python3 -m venv venv", ". venv/bin/activate"]
        return "".join(step + " && " for step in steps)


# PaperBench's salvage matrix after the plain run: {other python} x {fresh venv}.
DEFAULT_SALVAGE = (
    SalvageSetting(python="python3.11"),
    SalvageSetting(make_venv=True),
    SalvageSetting(python="python3.11", make_venv=True),
)


class ReproductionOptions(BaseModel):
    timeout_s: float = Field(gt=0)
    log_head_bytes: int = Field(default=DEFAULT_LOG_HEAD_BYTES, ge=0)
    log_tail_bytes: int = Field(default=DEFAULT_LOG_TAIL_BYTES, ge=1024)
    salvage: bool = False
    # Only a failed run shorter than this is salvaged (a long run failed for a real reason).
    salvage_threshold_s: float = Field(default=600.0, ge=0)
    salvage_settings: tuple[SalvageSetting, ...] = DEFAULT_SALVAGE
    limits: Limits = Field(default_factory=Limits)


class FileState(BaseModel):
    path: str
    sha256: str
    size: int


class RunAttempt(BaseModel):
    setting: SalvageSetting
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    log_sha256: str | None = None
    log_bytes: int = 0
    skipped: str | None = None  # why this setting could not be tried
    # Processes reproduce.sh left running when it ended (or besides it at the limit): killed.
    stray_processes: int = 0
    process_limit_reached: bool = False  # a failure whatever the exit status (a fork bomb)

    @property
    def ran_clean(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.process_limit_reached


class ReproductionResult(BaseModel):
    reproduce_sh_present: bool
    exit_code: int | None
    timed_out: bool
    duration_s: float
    log_sha256: str
    log_bytes_total: int
    log_truncated: bool
    files_before: list[FileState]
    files_after: list[FileState]
    added: list[str]
    removed: list[str]
    changed: list[str]
    not_kept: list[str] = Field(default_factory=list)  # produced but over the size limit
    git_status: str
    executed_manifest_sha256: str
    failure_class: str | None = None
    failure_rule: str | None = None
    failure_evidence: str | None = None
    salvage_used: bool = False
    attempts: list[RunAttempt] = Field(default_factory=list)
    stray_processes: int = 0  # left running by the chosen run, killed before the capture
    process_limit_reached: bool = False

    @property
    def succeeded(self) -> bool:
        return self.failure_class is None


class CappedLog:
    """A byte log that keeps its first `head` and last `tail` bytes, and passes chunks through."""

    def __init__(self, head: int, tail: int, forward: OutputSink | None = None) -> None:
        self.head_limit = head
        self.tail_limit = tail
        self.forward = forward
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, chunk: bytes) -> None:
        if self.forward is not None:
            self.forward(chunk)
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head.extend(chunk[:room])
            chunk = chunk[room:]
        if chunk:
            self.tail.extend(chunk)
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def content(self) -> bytes:
        if not self.truncated:
            return bytes(self.head) + bytes(self.tail)
        omitted = self.total - len(self.head) - len(self.tail)
        marker = f"\n[... {omitted} bytes of reproduce.log omitted ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


def _files(manifest: Manifest) -> list[FileState]:
    return [
        FileState(path=e.path, sha256=e.sha256, size=e.size)
        for e in manifest.files
        if e.sha256 is not None
    ]


def _without_venvs(manifest: Manifest) -> Manifest:
    def kept(path: str) -> bool:
        return path.split("/", 1)[0] not in VENV_DIRS

    return manifest.model_copy(update={"entries": [e for e in manifest.entries if kept(e.path)]})


def safe_git(args: str) -> str:
    """A shell command running ``git <args>`` on a participant's repository with nothing of
    theirs executed.

    The environment is emptied (no ``GIT_CONFIG_*``, ``GIT_DIR``, ``GIT_EXTERNAL_DIFF``...),
    system and global configuration are not read, and the repository's own configuration is
    overridden on the command line: no fsmonitor, no hooks, no untracked cache, every filter
    driver it names emptied (an empty ``clean``/``smudge``/``process`` runs nothing), submodules
    ignored (they would run git with their own configuration).
    """
    env = (
        "env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1"
        " GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0"
    )
    overrides = (
        "-c core.fsmonitor=false -c core.hooksPath=/dev/null -c core.untrackedCache=false"
        " -c core.pager=cat -c diff.external= -c core.attributesFile=/dev/null"
    )
    script = (
        'set --; while IFS= read -r key; do [ -n "$key" ] && set -- "$@" -c "$key="; done <<EOF\n'
        "$(git -c core.fsmonitor=false config --name-only --get-regexp"
        " '^filter[.].*[.](clean|smudge|process)$' 2>/dev/null)\n"
        "EOF\n"
        f'git "$@" {overrides} {args}'
    )
    return f"{env} sh -c {shlex.quote(script)}"


class _Runner:
    """The steps inside one workspace; each raises ReproductionError when the workspace fails."""

    def __init__(self, backend: WorkspaceBackend, handle: WorkspaceHandle) -> None:
        self.backend = backend
        self.handle = handle

    def sh(
        self, script: str, *, user: str | None = None, timeout_s: float = SETUP_TIMEOUT_S
    ) -> tuple[int | None, str]:
        try:
            result = self.backend.exec(
                self.handle,
                ["sh", "-c", script],
                user=user,
                workdir=SUBMISSION_DIR,
                timeout_s=timeout_s,
                max_output_bytes=GIT_STATUS_MAX_BYTES,
            )
        except WorkspaceError as exc:
            raise ReproductionError(str(exc)) from exc
        return result.exit_code, result.output.decode("utf-8", errors="replace")

    def must(self, script: str, what: str, *, user: str | None = None) -> str:
        code, output = self.sh(script, user=user)
        if code != 0:
            raise ReproductionError(f"{what} failed (exit {code}): {output.strip()[-500:]}")
        return output

    def restore(self, store: BlobStore, manifest: Manifest) -> None:
        """Empty /home/submission and unpack the snapshot there, owned by the workspace's user
        (streamed from a temporary file: the snapshot is never held whole in memory)."""
        uid, gid = map(
            int, self.must('echo "$(id -u) $(id -g)"', "finding the workspace user").split()
        )
        self.must(f"find {SUBMISSION_DIR} -mindepth 1 -delete", "emptying the submission")
        parent = SUBMISSION_DIR.rstrip("/").rsplit("/", 1)[0] or "/"
        try:
            with tar_file(store, manifest, root=EXPORT_ROOT, owner=(uid, gid)) as archive:
                self.backend.put_archive(self.handle, parent, archive)
        except WorkspaceError as exc:
            raise ReproductionError(f"restoring the snapshot failed: {exc}") from exc
        self.must("rm -rf " + " ".join(VENV_DIRS), "removing virtual environments")

    def run_script(
        self, setting: SalvageSetting, timeout_s: float, log: CappedLog
    ) -> guarded_run.GuardedRun:
        """Run reproduce.sh under its guard, which stops it and everything it started at the
        limit or when it ends (`scoring.guarded_run`). A guard that did not finish (killed by
        the run or by the OOM killer, or past the grace) leaves processes behind: the workspace
        is restarted, which stops them all, and the run is what its exec's end says."""
        # One pipe for both streams: the engine reads stdout and stderr apart, and under load
        # their lines could reach the log out of the order the script wrote them.
        script = f"{setting.prelude()}bash {REPRODUCE_SCRIPT} 2>&1"
        try:
            ran = self.backend.exec(
                self.handle,
                guarded_run.command(script, timeout_s),
                workdir=SUBMISSION_DIR,
                timeout_s=timeout_s + GUARD_GRACE_S,
                on_output=log.write,
                max_output_bytes=64 * 1024,
            )
        except WorkspaceError as exc:
            raise ReproductionError(f"running {REPRODUCE_SCRIPT} failed: {exc}") from exc
        if ran.exit_code == 0 and (record := guarded_run.parse_record(log.content()[-4096:])):
            return record
        killed = ran.exit_code is not None and ran.exit_code >= 128
        if not (killed or ran.timed_out):  # the guard itself failed: Baseline's own failure
            raise ReproductionError(
                f"the guard of {REPRODUCE_SCRIPT} failed (exit {ran.exit_code}): "
                f"{ran.output.decode(errors='replace')[-500:]}"
            )
        try:
            self.backend.stop(self.handle)
            self.backend.start(self.handle)
        except WorkspaceError as exc:
            raise ReproductionError(f"restarting the workspace failed: {exc}") from exc
        how = "ran past its grace" if ran.timed_out else f"was killed (exit {ran.exit_code})"
        log.write(
            f"\n[baseline] the guard of {REPRODUCE_SCRIPT} {how}; the workspace was restarted, "
            "which stopped every process of the run\n".encode()
        )
        return guarded_run.GuardedRun(
            exit_code=ran.exit_code, timed_out=ran.timed_out, duration_s=ran.duration_s
        )

    def capture(self, store: BlobStore, limits: Limits) -> tuple[str, Manifest]:
        root = SUBMISSION_DIR.rstrip("/").rsplit("/", 1)[-1]
        try:
            captured = capture_archive(
                lambda: archive_reader(self.backend, self.handle, SUBMISSION_DIR),
                store,
                limits,
                root=root,
                source="reproduction",
            )
        except (WorkspaceError, CaptureError) as exc:
            raise ReproductionError(f"capturing the executed submission failed: {exc}") from exc
        return captured.manifest_sha256, captured.manifest


def reproduce_in_workspace(
    backend: WorkspaceBackend,
    handle: WorkspaceHandle,
    store: BlobStore,
    manifest_sha256: str,
    options: ReproductionOptions,
    on_output: OutputSink | None = None,
) -> ReproductionResult:
    """Reproduce the snapshot `manifest_sha256` in a started, fresh workspace (not destroyed)."""
    try:
        manifest = _without_venvs(load_manifest(store, manifest_sha256))
    except (KeyError, ValueError) as exc:
        raise ReproductionError(
            f"snapshot manifest {manifest_sha256} is unreadable: {exc}"
        ) from exc
    runner = _Runner(backend, handle)
    runner.restore(store, manifest)
    present_code, _ = runner.sh(f"test -f {REPRODUCE_SCRIPT}")
    present = present_code == 0

    settings: list[SalvageSetting] = [SalvageSetting()]
    if options.salvage:
        settings += list(options.salvage_settings)
    attempts: list[RunAttempt] = []
    chosen: tuple[RunAttempt, CappedLog] | None = None
    started = time.monotonic()
    for index, setting in enumerate(settings):
        if not present:
            break
        # The first run has the whole limit (what it prints as its limit: the microseconds
        # since `started`, on a loaded machine, made it "2.99995 s"); a salvage run what is left.
        remaining = options.timeout_s - (time.monotonic() - started if index > 0 else 0.0)
        if index > 0:
            previous = attempts[-1] if chosen is None else chosen[0]
            failed_fast = (
                not previous.timed_out
                and previous.exit_code != 0
                and previous.duration_s < options.salvage_threshold_s
            )
            if not failed_fast or remaining <= 1:
                break
            if setting.python:
                code, _ = runner.sh(f"command -v {shlex.quote(setting.python)}")
                if code != 0:
                    attempts.append(
                        RunAttempt(setting=setting, skipped=f"{setting.python} is not in the image")
                    )
                    continue
            runner.restore(store, manifest)
        log = CappedLog(options.log_head_bytes, options.log_tail_bytes, on_output)
        ran = runner.run_script(setting, remaining, log)
        content = log.content()
        attempt = RunAttempt(
            setting=setting,
            exit_code=ran.exit_code,
            timed_out=ran.timed_out,
            duration_s=ran.duration_s,
            log_sha256=store.put_bytes(content),
            log_bytes=log.total,
            stray_processes=ran.stray_processes,
            process_limit_reached=ran.process_limit_reached,
        )
        attempts.append(attempt)
        chosen = (attempt, log)
        if attempt.ran_clean:
            break

    if chosen is None:
        final = RunAttempt(setting=SalvageSetting())
        log = CappedLog(options.log_head_bytes, options.log_tail_bytes)
        missing = f"{REPRODUCE_SCRIPT} not found at the top of the submission\n".encode()
        log.write(missing)
        final.log_sha256 = store.put_bytes(log.content())
        chosen = (final, log)
    attempt, log = chosen
    executed_sha, executed = runner.capture(store, options.limits)
    left = options.timeout_s - (time.monotonic() - started)
    status_code, git_status = runner.sh(
        safe_git(
            "--no-optional-locks status --porcelain=v1 --untracked-files=all"
            " --ignore-submodules=all"
        )
        + f" 2>&1 | head -c {GIT_STATUS_MAX_BYTES}",
        timeout_s=max(left, GIT_STATUS_MIN_S),
    )
    if status_code is None:
        git_status += "\n[git status did not finish within the time limit]\n"
    change = diff(manifest, executed)
    text = log.content().decode("utf-8", errors="replace")
    verdict = classify(
        RunFacts(
            reproduce_sh_present=present,
            exit_code=attempt.exit_code,
            timed_out=attempt.timed_out,
            log=text,
            process_limit_reached=attempt.process_limit_reached,
        )
    )
    assert attempt.log_sha256 is not None
    return ReproductionResult(
        reproduce_sh_present=present,
        exit_code=attempt.exit_code,
        timed_out=attempt.timed_out,
        duration_s=sum(a.duration_s for a in attempts),
        log_sha256=attempt.log_sha256,
        log_bytes_total=log.total,
        log_truncated=log.truncated,
        files_before=_files(manifest),
        files_after=_files(executed),
        added=change.added,
        removed=change.removed,
        changed=change.changed,
        not_kept=sorted(s.path for s in executed.skipped if s.reason == "too_large"),
        git_status=git_status,
        executed_manifest_sha256=executed_sha,
        failure_class=None if verdict is None else verdict.failure.value,
        failure_rule=None if verdict is None else verdict.rule,
        failure_evidence=None if verdict is None else verdict.evidence,
        salvage_used=len(attempts) > 1,
        attempts=attempts,
        stray_processes=attempt.stray_processes,
        process_limit_reached=attempt.process_limit_reached,
    )


def reproduce(
    backend: WorkspaceBackend,
    spec: WorkspaceSpec,
    store: BlobStore,
    manifest_sha256: str,
    options: ReproductionOptions,
    on_output: OutputSink | None = None,
) -> ReproductionResult:
    """Create a fresh workspace from `spec`, reproduce the snapshot in it, always destroy it."""
    if spec.task_dir is not None:
        raise ReproductionError("a reproduction workspace gets no task files")
    try:
        handle = backend.create(spec)
    except WorkspaceError as exc:
        raise ReproductionError(f"creating the reproduction workspace failed: {exc}") from exc
    try:
        try:
            backend.start(handle)
        except WorkspaceError as exc:
            raise ReproductionError(f"starting the reproduction workspace failed: {exc}") from exc
        return reproduce_in_workspace(backend, handle, store, manifest_sha256, options, on_output)
    finally:
        backend.destroy(handle)
