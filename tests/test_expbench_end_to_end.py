"""Acceptance: an EXP-Bench task end to end on the real dockerd with the local fake model.

An imported EXP-Bench question is attempted in a Docker workspace that starts from the masked
repository (fresh git history), the participant's work is snapshotted at a checkpoint, and the
orchestration queue reproduces every snapshot in a fresh workspace (``reproduce.sh`` running
``reproduce_exp_bench.sh``) and grades it per stage through the fake judge. The stage grades and
the execution result are stored per snapshot and shown on the attempt's scoring page and in the
analysis table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select

from analysis.table import build_table
from baseline.attempts import launch
from baseline.attempts.snapshots import resolve_source, store_for, take_snapshot
from baseline.context import Context
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    Grading,
    Host,
    JobStatus,
    ModelCall,
    Reproduction,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    Workspace,
)
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.snapshots import load_manifest
from infra.workspace import WorkspaceBackend
from tests.baseline import expbench_world
from tests.baseline.grading.test_expbench_grading import fake_judge
from tests.conftest import Users, login
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import config

pytestmark = pytest.mark.docker
__all__ = ["test_image"]

WORK = r"""
set -e
cd /home/submission
cat > model.py <<'PY'
class SmoothedLoss:
    def __call__(self, x):
        return x
PY
cat > reproduce_exp_bench.sh <<'SH'
set -e
python3 train.py
echo "accuracy with smoothing 0.91, without 0.90"
SH
cat > exp_bench_answer.json <<'JSON'
{"design": {"independent": "label smoothing"},
 "conclusion": "Smoothing improves accuracy by 1 point."}
JSON
"""


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@pytest.fixture
def cleanup(ctx: Context) -> Iterator[None]:
    docker_url("unix")
    yield
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def _exec(ctx: Context, attempt_id: int, script: str) -> str:
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == attempt_id)
        ).first()
        assert workspace is not None
        handle = workspaces.handle_of(workspace)
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["bash", "-c", script], timeout_s=60)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    return result.output.decode()


@pytest.mark.sqlite_only(
    "the stages' reproduction and judging (their rows: tests/baseline/grading, both)"
)
def test_expbench_attempt_graded_per_stage_end_to_end(
    ctx: Context,
    cleanup: None,
    test_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    app: Flask,
    users: Users,
) -> None:
    monkeypatch.setenv("FAKE_JUDGE_KEY", "not-a-real-key")
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", LOCAL_URL, None)
        assert workspaces.check_host(session, host).healthy
        blobs = BlobStore(ctx.settings.blob_dir)
        task = tasks.import_tasks(session, blobs, [expbench_world.build(tmp_path)])[0].task
        study = studies.create_study(
            session, studies.StudySpec(name="EXP-Bench", reproduction_timeout_minutes=5), None
        )
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(
            session, study, "agent", "basic", "m", "http://127.0.0.1:9/v1", None, None
        )
        attempt_id = studies.create_attempt(session, agent, task, None).id
        study_id = study.id

    launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    seen = _exec(
        ctx,
        attempt_id,
        "cd /home/submission && ls -A && git log --all -p && git rev-list --all --objects",
    )
    assert "train.py" in seen and "reproduce.sh" in seen
    assert "model.py" not in seen and "README.md" not in seen  # EXP-Bench masks the README
    assert expbench_world.MASKED_MARKER not in seen

    _exec(ctx, attempt_id, WORK)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        source = resolve_source(session, attempt)
    checkpoint = take_snapshot(ctx, attempt_id, SnapshotKind.CHECKPOINT, 60.0, source).id

    with FakeOpenAI(answer=fake_judge) as server:
        with ctx.session() as session:
            row = session.get(Study, study_id)
            assert row is not None
            judge = config(server.base_url, api_key_env="FAKE_JUDGE_KEY")
            orchestration.set_study_judge(session, row, judge, code_dev=False, actor_id=None)
        report = orchestration.process_queue(ctx, attempt_id=attempt_id, backend_factory=factory)
        assert report.errors == []
        again = orchestration.process_queue(ctx, attempt_id=attempt_id, backend_factory=factory)
        assert again.gradings == {} and again.reproductions == {}
        calls = server.calls

    store = store_for(ctx)
    with ctx.session() as session:
        snapshots = {
            s.kind: s
            for s in session.scalars(select(Snapshot).where(Snapshot.attempt_id == attempt_id))
        }
        start = snapshots[SnapshotKind.START]
        started_with = {e.path for e in load_manifest(store, start.manifest_sha256).files}
        assert "train.py" in started_with and "model.py" not in started_with
        stages = {}
        for snap in (start, snapshots[SnapshotKind.CHECKPOINT]):
            reproduction = session.scalars(
                select(Reproduction).where(Reproduction.snapshot_id == snap.id)
            ).one()
            assert reproduction.status is JobStatus.SUCCEEDED, reproduction.error
            grading = session.scalars(select(Grading).where(Grading.snapshot_id == snap.id)).one()
            assert grading.reproduction_id == reproduction.id
            stages[snap.kind] = {
                k: v["score"] for k, v in grading.category_scores["stages"].items()
            }
        assert stages[SnapshotKind.CHECKPOINT]["execution"] == 1.0
        assert stages[SnapshotKind.CHECKPOINT]["implementation"] == 0.5
        assert stages[SnapshotKind.CHECKPOINT]["conclusion"] == 1.0
        assert stages[SnapshotKind.START]["execution"] == 0.0  # no reproduce_exp_bench.sh yet
        assert stages[SnapshotKind.START]["conclusion"] == 0.0
        ledger = session.scalar(
            select(func.count()).select_from(ModelCall).where(ModelCall.grading_id.is_not(None))
        )
        assert ledger == calls == 6  # monitor, design and conclusion, implementation: twice
        table = build_table(session, session.get(Study, study_id))  # type: ignore[arg-type]
    row = table[table["snapshot_id"] == checkpoint].iloc[0]
    assert row["stage:execution"] == 1.0 and row["stage:design"] == 0.75
    assert row["score"] == row["stage:all_passed"] == 0.0  # the headline: EXP-Bench's success
    assert row["task_kind"] == "expbench"

    client = app.test_client()
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/grading/attempt/{attempt_id}").get_data(as_text=True)
    assert page.count("<td>implementation</td>") == 2 and "the --smoothing flag is missing" in page
