"""A study worth archiving, fast: the synthetic study (humans and two agent groups, scores,
pauses, judge, script and expert gradings, attempts ended early, incomplete and failed gradings,
one snapshot not graded) plus what an archive must carry or must not: people with names, e-mail
addresses and account ids, scores at the task's floor, free-text notes, a terminal recording,
agent transcripts with tool calls, real blobs (snapshot files, logs, task files, tool output),
and a workspace image digest.

The synthetic study is seeded without a blob store (0.8 s, against 11 s with every snapshot
captured); a few snapshots are then captured for real, so the archive holds real blobs and also
names digests its home never had.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis.seed import seed_synthetic_study
from baseline.models import (
    AgentRun,
    AgentRunStatus,
    Attempt,
    FileVisibility,
    Grading,
    GradingKind,
    JobStatus,
    Participant,
    ParticipantKind,
    Pause,
    Reproduction,
    Role,
    Snapshot,
    Study,
    TaskFile,
    TaskKind,
    TerminalRecording,
    TranscriptEntry,
    User,
    Workspace,
    WorkspacePurpose,
)
from infra.blobs import BlobStore
from infra.snapshots import capture_directory

NAME = "archive study"
NOTE = "NOTE-MARKER: left for the dentist"
RECORDING = b"RECORDING-MARKER zelda@laptop:~$ python train.py\n"
ACCOUNT_BASE = 987_650_000  # account ids no other number of the study can contain


@dataclass
class World:
    study_id: int
    secrets: list[bytes] = field(default_factory=list)  # names, e-mails, account ids
    tool_call_ids: dict[int, list[str]] = field(default_factory=dict)  # attempt -> call ids
    floors: int = 0


def build(session: Session, store: BlobStore, work: Path) -> World:
    study = seed_synthetic_study(session, name=NAME, seed=5)
    world = World(study.id)
    _people(session, study, world)
    attempts = list(
        session.scalars(select(Attempt).where(Attempt.study_id == study.id).order_by(Attempt.id))
    )
    _floors(session, attempts, world)
    _notes_and_recordings(session, attempts)
    _transcripts(session, store, attempts, world)
    _blobs(session, store, attempts, work)
    session.flush()
    return world


def _user(session: Session, n: int, name: str, role: Role, world: World) -> User:
    user = User(
        id=ACCOUNT_BASE + n,
        email=f"{name.split()[0].lower()}.{n}@private-mail.example",
        name=name,
        password_hash="x",
        role=role,
    )
    session.add(user)
    world.secrets += [user.email.encode(), user.name.encode(), str(user.id).encode()]
    return user


def _people(session: Session, study: Study, world: World) -> None:
    humans = session.scalars(
        select(Participant).where(
            Participant.study_id == study.id, Participant.kind == ParticipantKind.HUMAN
        )
    )
    for n, participant in enumerate(humans, start=1):
        user = _user(session, n, f"Zelda{n} Quimby-Okonkwo", Role.PARTICIPANT, world)
        session.flush()
        participant.display_name, participant.user_id = user.name, user.id
    expert = _user(session, 90, "Ignatius Fairweather", Role.GRADER, world)
    coordinator = _user(session, 91, "Cordelia Vantongeren", Role.COORDINATOR, world)
    session.flush()
    study.created_by_id = coordinator.id
    gradings = session.scalars(
        select(Grading)
        .join(Snapshot)
        .join(Attempt)
        .where(Attempt.study_id == study.id, Grading.kind == GradingKind.EXPERT)
    )
    for grading in gradings:
        grading.grader_id = expert.id
        for leaf in grading.leaves:
            leaf.explanation = "checked by hand"


def _floors(session: Session, attempts: list[Attempt], world: World) -> None:
    """Two scored attempts' last script grading: the submission failed its scoring."""
    scored = [a for a in attempts if a.task.kind is TaskKind.SCORED][:2]
    for attempt in scored:
        grading = session.scalars(
            select(Grading)
            .join(Snapshot)
            .where(Snapshot.attempt_id == attempt.id, Grading.status == JobStatus.SUCCEEDED)
            .order_by(Grading.id.desc())
        ).first()
        assert grading is not None
        grading.score, grading.raw_score, grading.floor_reason = 0.0, 0.0, "no_score"
        world.floors += 1


def _notes_and_recordings(session: Session, attempts: list[Attempt]) -> None:
    human = next(a for a in attempts if a.participant.kind is ParticipantKind.HUMAN)
    pause = session.scalars(select(Pause).where(Pause.attempt_id == human.id)).first()
    assert pause is not None
    pause.note = NOTE
    session.add(
        TerminalRecording(
            attempt_id=human.id,
            path="/home/agent/.terminal/1.typescript",
            kind="session",
            content=RECORDING,
            size=len(RECORDING),
        )
    )


def _transcripts(session: Session, store: BlobStore, attempts: list[Attempt], world: World) -> None:
    """Two agent attempts with a run each: a system and a task message, then tool calls."""
    agents = [a for a in attempts if a.participant.kind is ParticipantKind.AGENT][:2]
    for attempt in agents:
        start = attempt.started_at
        assert start is not None
        run = AgentRun(
            attempt_id=attempt.id,
            scaffold="basic",
            model=attempt.participant.agent_model or "model",
            settings={"model": {"model": "model-a", "input_usd_per_mtok": 1.0}},
            status=AgentRunStatus.FINISHED,
            steps=3,
            prompt_tokens=1200,
            completion_tokens=300,
            cost_usd=0.42,
            started_at=start,
        )
        session.add(run)
        session.flush()
        ids = [f"call_{attempt.id}_{i}" for i in range(3)]
        world.tool_call_ids[attempt.id] = ids
        big_output = store.put_bytes(b"epoch 1 loss 0.3\n" * 500)
        steps: list[dict[str, object]] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Improve the score of the model."},
            {
                "role": "assistant",
                "content": "Looking around.",
                "tool_calls": [_call(ids[0], "ls")],
            },
            {"role": "tool", "content": "train.py", "tool_call_id": ids[0], "tool_name": "bash"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call(ids[1], "python train.py"), _call(ids[2], "cat out")],
            },
            {
                "role": "tool",
                "content": "loss 0.3",
                "tool_call_id": ids[1],
                "tool_name": "bash",
                "output_sha256": big_output,
                "output_bytes": 8500,
            },
            {"role": "tool", "content": "done", "tool_call_id": ids[2], "tool_name": "bash"},
            {"role": "assistant", "content": "Submitted."},
        ]
        for seq, step in enumerate(steps):
            session.add(
                TranscriptEntry(
                    run_id=run.id,
                    seq=seq,
                    kind="message",
                    started_at=start + timedelta(minutes=seq),
                    ended_at=start + timedelta(minutes=seq, seconds=30),
                    working_s=60.0 * seq,
                    **step,
                )
            )
        session.add(
            TranscriptEntry(run_id=run.id, seq=len(steps), kind="notice", content="run ended")
        )


def _call(call_id: str, command: str) -> dict[str, object]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'},
    }


def _blobs(session: Session, store: BlobStore, attempts: list[Attempt], work: Path) -> None:
    """Real content: three captured snapshots, reproduction logs, a rubric file per task, and
    the image one workspace ran."""
    snaps = list(
        session.scalars(
            select(Snapshot)
            .where(Snapshot.attempt_id.in_([a.id for a in attempts]))
            .order_by(Snapshot.id)
            .limit(3)
        )
    )
    for n, snap in enumerate(snaps):
        folder = work / f"snap{n}"
        folder.mkdir(parents=True)
        (folder / "solution.py").write_text(f"print({n})\n")
        (folder / "README.md").write_text("# reproduce with python solution.py\n")
        captured = capture_directory(folder, store, source="workspace")
        snap.manifest_sha256 = captured.manifest_sha256
        snap.file_count = captured.file_count
    for repro in session.scalars(select(Reproduction).order_by(Reproduction.id).limit(4)):
        repro.log_sha256 = store.put_bytes(f"reproduction {repro.id}: exit 0\n".encode())
    for task in {a.task for a in attempts}:
        rubric = f'{{"task": "{task.slug}", "version": 3}}'.encode()
        session.add(
            TaskFile(
                task_id=task.id,
                path="rubric.json",
                sha256=store.put_bytes(rubric),
                size=len(rubric),
                visibility=FileVisibility.HIDDEN,
            )
        )
    session.add(
        Workspace(
            attempt_id=attempts[0].id,
            purpose=WorkspacePurpose.ATTEMPT,
            backend="docker",
            name=f"ws-archive-{attempts[0].id}",
            image="baseline/workspace:latest",
            image_digest="sha256:" + "ab" * 32,
            hardware_profile="cpu",
        )
    )


def rewrite_member(archive: Path, member: str, out: Path) -> None:
    """A copy of `archive` whose `member` has one byte changed (the manifest left as it was)."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == member:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            dst.addfile(info, io.BytesIO(data))


# The analysis tables' id columns, and the archive table each id is a row of.
ID_TABLES = {
    "study_id": "studies",
    "task_id": "tasks",
    "participant_id": "participants",
    "attempt_id": "attempts",
    "snapshot_id": "snapshots",
}


def mapped_ids(frame: pd.DataFrame, ids: dict[str, dict[int, int]]) -> pd.DataFrame:
    """The source home's table with its ids translated into the importing home's (`ids`, the
    import's map from archive ids to this home's, per table)."""
    out = frame.copy()
    for column, table in ID_TABLES.items():
        if column in out.columns:
            out[column] = (
                out[column]
                .map(lambda v, t=table: ids[t][int(v)], na_action="ignore")
                .astype(frame[column].dtype)
            )
    return out
