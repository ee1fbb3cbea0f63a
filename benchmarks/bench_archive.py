"""Study archive time and size against a plain `tar` of the same blobs.

A study of 100 attempts x 5 checkpoint snapshots (``--attempts``, ``--snapshots``) is made in a
temporary home: each attempt's submission is 15 source files (about 2 KiB of text each) and one
64 KiB binary file (``--binary-kib``: 2048 makes a 1 GiB archive of the same rows); between
checkpoints the binary file and two source files change. Every snapshot is captured into the
blob store and graded (a script grading with a score), so the archive carries the study's
tables, the analysis' tidy table, and every snapshot's manifest and files. Measured, each the
median of ``--repeat`` runs:

- ``baseline study archive`` (`analysis.archive.archive_study`) into .tar, against `tar cf` of
  exactly the blobs the archive holds (from the store's folder, by a file list);
- the same into .tar.gz, against `tar czf`;
- opening the archive (its tables hashed, no blob), and opening it and reading the study from
  it as ``plot --archive`` does (`analysis.archive.load_archive`), against opening it with every
  blob hashed too (`Archive.verify`), which every open did before;
- the import of the archive into a fresh home (hashes checked, rows and blobs written).

    .venv/bin/python benchmarks/bench_archive.py [--attempts 100] [--snapshots 5] [--repeat 3]
        [--binary-kib 64]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar

from analysis.archive import archive_study, load_archive
from baseline import migrate
from baseline.archive.export import ExportResult
from baseline.archive.importer import import_archive
from baseline.archive.reader import open_archive
from baseline.attempts.snapshots import store_for
from baseline.config import Settings
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    GradingKind,
    JobStatus,
    Participant,
    ParticipantKind,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    Task,
    TaskKind,
)
from infra.snapshots import capture_directory

T = TypeVar("T")
EPOCH = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


def _home(root: Path) -> Context:
    root.mkdir(parents=True)
    url = f"sqlite:///{root / 'baseline.db'}"
    migrate.upgrade(url)
    return Context.from_settings(Settings(home=root, database_url=url, secret_key="bench"))


def _source_text(rng: random.Random) -> str:
    words = ["def", "return", "model", "loss", "train", "score", "import", "for", "in", "x", "y"]
    lines = (" ".join(rng.choice(words) for _ in range(8)) for _ in range(50))
    return "\n".join(lines) + "\n"


def make_study(
    ctx: Context, work: Path, attempts: int, snapshots: int, binary_kib: int = 64
) -> int:
    """The study described above; returns its id."""
    rng = random.Random(0)
    store = store_for(ctx)
    checkpoints = [float(h + 1) for h in range(snapshots)]
    with ctx.session() as session:
        study = Study(name="bench archive", checkpoint_hours=checkpoints)
        task = Task(slug="bench-task", title="Bench task", kind=TaskKind.SCORED, content_hash="0")
        session.add_all([study, task])
        session.flush()
        session.add(StudyTask(study_id=study.id, task_id=task.id))
        people = []
        for n in range(10):
            human = n < 5
            people.append(
                Participant(
                    study_id=study.id,
                    kind=ParticipantKind.HUMAN if human else ParticipantKind.AGENT,
                    display_name=f"participant {n}",
                    pseudonym=f"P-{n:06X}",
                    agent_model=None if human else "model-a",
                    agent_scaffold=None if human else "basic",
                )
            )
        session.add_all(people)
        session.flush()
        for a in range(attempts):
            started = EPOCH + timedelta(days=a)
            attempt = Attempt(
                study_id=study.id,
                participant_id=people[a % len(people)].id,
                task_id=task.id,
                status=AttemptStatus.ENDED,
                hardware_profile="cpu",
                working_time_limit_s=checkpoints[-1] * 3600,
                started_at=started,
                ended_at=started + timedelta(hours=checkpoints[-1]),
            )
            session.add(attempt)
            session.flush()
            folder = work / f"attempt{a}"
            folder.mkdir(parents=True)
            for f in range(15):
                (folder / f"src{f}.py").write_text(_source_text(rng))
            for c, hours in enumerate(checkpoints):
                (folder / "weights.bin").write_bytes(rng.randbytes(binary_kib * 1024))
                for f in rng.sample(range(15), 2):
                    (folder / f"src{f}.py").write_text(_source_text(rng))
                captured = capture_directory(folder, store, source="workspace")
                taken = started + timedelta(hours=hours)
                snap = Snapshot(
                    attempt_id=attempt.id,
                    kind=SnapshotKind.CHECKPOINT,
                    due_working_s=hours * 3600,
                    taken_working_s=hours * 3600,
                    taken_at=taken,
                    manifest_sha256=captured.manifest_sha256,
                    file_count=captured.file_count,
                    total_bytes=captured.total_bytes,
                )
                session.add(snap)
                session.flush()
                score = min(1.0, 0.1 * (c + 1) + rng.random() * 0.1)
                session.add(
                    Grading(
                        snapshot_id=snap.id,
                        kind=GradingKind.SCRIPT,
                        status=JobStatus.SUCCEEDED,
                        score=score,
                        raw_score=score,
                        created_at=taken,
                    )
                )
            shutil.rmtree(folder)
        return study.id


def _timed(run: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def _archive(ctx: Context, study_id: int, out: Path) -> ExportResult:
    out.unlink(missing_ok=True)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        return archive_study(session, store_for(ctx), study, out)


def _tar(ctx: Context, exported: ExportResult, out: Path, flags: str) -> None:
    """`tar` of exactly the blobs the archive holds, as they lie in the store."""
    root = store_for(ctx).root
    listing = out.with_suffix(".list")
    listing.write_text(
        "".join(
            f"{store_for(ctx).path(f.sha256).relative_to(root)}\n"
            for f in exported.manifest.files
            if f.path.startswith("blobs/")
        )
    )
    out.unlink(missing_ok=True)
    subprocess.run(["tar", flags, str(out), "-C", str(root), "-T", str(listing)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--snapshots", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--binary-kib", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bl-bench-archive-") as tmp:
        root = Path(tmp)
        ctx = _home(root / "source")
        made, study_id = _timed(
            lambda: make_study(ctx, root / "work", args.attempts, args.snapshots, args.binary_kib)
        )
        print(
            f"study: {args.attempts} attempts x {args.snapshots} snapshots (made in {made:.1f} s)"
        )
        exported = _archive(ctx, study_id, root / "study.tar")
        blobs = sum(1 for f in exported.manifest.files if f.path.startswith("blobs/"))
        blob_bytes = sum(f.size for f in exported.manifest.files if f.path.startswith("blobs/"))
        print(
            f"archive holds {len(exported.manifest.files)} files: {blobs} blobs "
            f"({blob_bytes / 2**20:.1f} MiB), the rest tables, results, README"
        )
        for suffix, flags in ((".tar", "cf"), (".tar.gz", "czf")):
            ours, plain = [], []
            for _ in range(args.repeat):
                seconds, exported = _timed(
                    partial(_archive, ctx, study_id, root / f"study{suffix}")
                )
                ours.append(seconds)
                plain.append(
                    _timed(partial(_tar, ctx, exported, root / f"plain{suffix}", flags))[0]
                )
            size, tar_size = exported.size, (root / f"plain{suffix}").stat().st_size
            t_ours, t_plain = statistics.median(ours), statistics.median(plain)
            print(
                f"{suffix:8} archive {t_ours:6.2f} s {size / 2**20:7.1f} MiB | tar {flags:3} "
                f"{t_plain:6.2f} s {tar_size / 2**20:7.1f} MiB | time {t_ours / t_plain:5.2f}x "
                f"size {size / tar_size:5.3f}x"
            )
        for suffix in (".tar", ".tar.gz"):
            path = root / f"study{suffix}"
            runs = (_opened, load_archive, _verified)
            times: list[list[float]] = [[] for _ in runs]
            for _ in range(args.repeat):  # in turn, so none has the page cache to itself
                for run, taken in zip(runs, times, strict=True):
                    taken.append(_timed(partial(run, path))[0])
            opened, read, checked = (statistics.median(taken) for taken in times)
            print(
                f"{suffix:8} open {opened:6.3f} s | open and read the study {read:6.3f} s | "
                f"open, every blob hashed {checked:6.3f} s: {checked / opened:5.1f}x the open"
            )
        imports = [
            _timed(partial(_import, _home(root / f"import{n}"), root / "study.tar"))[0]
            for n in range(args.repeat)
        ]
        print(f"import into a fresh home (hashes checked): {statistics.median(imports):.2f} s")


def _opened(path: Path) -> None:
    with open_archive(path):
        pass


def _verified(path: Path) -> None:
    with open_archive(path) as archive:
        archive.verify()


def _import(target: Context, path: Path) -> None:
    with open_archive(path) as archive, target.session() as session:
        import_archive(session, store_for(target), archive)


if __name__ == "__main__":
    main()
