"""METR Task Standard task families as scored tasks: import, launch checks, install, start, scoring.

The family is written here: "make this function faster", measured deterministically as the number
of Python function calls `total(200)` makes (the loop through an `add` helper makes 202, the closed
form 1). Its scorer lives in the family folder, which reaches the participant's workspace only at
/root (root only, where the Task Standard puts it) and the scoring container only at scoring
time.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from analysis.table import SOURCE_SCORE_LOG, SOURCE_SNAPSHOT, build_table
from baseline.attempts import attempts, launch
from baseline.attempts.snapshots import resolve_source
from baseline.cli import main
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.grading import script_scoring
from baseline.models import (
    Attempt,
    AttemptStatus,
    FileVisibility,
    Host,
    JobStatus,
    Study,
    StudyTask,
    Task,
    Workspace,
    WorkspaceStatus,
)
from baseline.studies import agent_enrolment, studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.workspace import PARTICIPANT_USER, WorkspaceBackend, WorkspaceState
from scoring.task_standard import TaskStandardError, inspect_family
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image

__all__ = ["test_image"]


@pytest.fixture(autouse=True)
def inspecting_engine() -> None:
    """A family is inspected in a container of its own image: importing one needs the engine."""
    docker_url("unix")


STARTING = """\
def add(a, b):
    return a + b


def total(n):
    s = 0
    for i in range(n + 1):
        s = add(s, i)
    return s
"""
REFERENCE = "def total(n):\n    return n * (n + 1) // 2\n"

SCORER = """\
import importlib.util
import sys


def calls_of(path):
    spec = importlib.util.spec_from_file_location("solution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        value = module.total(200)
    finally:
        sys.setprofile(None)
    if value != 20100:
        return None
    return count
"""

FAMILY = """\
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "assets"))
import scorer


class TaskFamily:
    standard_version = {version!r}

    @staticmethod
    def get_tasks():
        return {{"main": {{"n": 200, "starting_score": 202, "reference_score": 1,
                           "score_direction": "lower"}}}}

    @staticmethod
    def get_instructions(t):
        return "Make total() in /home/agent/solution.py faster (fewer calls)."

    @staticmethod
    def get_permissions(t):
        return {permissions!r}

    @staticmethod
    def install():
        Path("/opt/fastfn-installed").write_text("installed at image build\\n")

    @staticmethod
    def start(t):
        {start}
        if not Path("/opt/fastfn-installed").exists():
            raise RuntimeError("install() did not run at image build")
        shutil.copy(Path(__file__).parent / "assets" / "starting.py", "/home/agent/solution.py")

    @staticmethod
    def teardown(t):
        Path("/root/torn-down").write_text(t["n"].__str__())

    @staticmethod
    def score(t, submission):
        return scorer.calls_of("/home/agent/solution.py")

    @staticmethod
    def intermediate_score(t):
        calls = scorer.calls_of("/home/agent/solution.py")
        return {{"score": calls, "message": {{"calls": calls}}}}
"""


def write_family(
    root: Path,
    *,
    name: str = "fastfn",
    version: str = "0.3.0",
    start: str = "pass",
    permissions: tuple[str, ...] = (),
    manifest: str | None = None,
) -> Path:
    folder = root / name
    (folder / "assets").mkdir(parents=True)
    source = FAMILY.format(version=version, permissions=list(permissions), start=start)
    (folder / f"{name}.py").write_text(source)
    (folder / "assets" / "scorer.py").write_text(SCORER)
    (folder / "assets" / "starting.py").write_text(STARTING)
    if manifest is not None:
        (folder / "manifest.yaml").write_text(textwrap.dedent(manifest))
    return folder


def stored_files(folder: Path) -> dict[str, bytes]:
    """The family folder's files, as import stores them (what inspect_family is given)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _import(ctx: Context, folder: Path) -> list[Task]:
    with ctx.session() as session:
        results = tasks.import_tasks(session, BlobStore(ctx.settings.blob_dir), [folder])
        return [r.task for r in results]


def test_family_import_makes_a_scored_task_per_task(ctx: Context, tmp_path: Path) -> None:
    folder = write_family(tmp_path)
    (imported,) = _import(ctx, folder)
    with ctx.session() as session:
        task = session.get(Task, imported.id)
        assert task is not None
        assert task.slug == "fastfn-main"
        visible = {f.path for f in tasks.task_files(task)}
        protected = {f.path for f in tasks.task_files(task, [FileVisibility.PROTECTED])}
        assert visible == {"instructions.md"}
        assert {"family/fastfn.py", "family/assets/scorer.py", "family/assets/starting.py"} <= (
            protected
        )
        blobs = BlobStore(ctx.settings.blob_dir)
        assert b"faster" in tasks.read_task_file(blobs, task, "instructions.md")
        assert task.scoring is not None
        standard = task.scoring["task_standard"]
        assert standard["hardware_profile"] == "cpu"
        assert task.scoring["starting_score"] == 202 and task.scoring["direction"] == "lower"
    # Identical content imports as unchanged.
    with ctx.session() as session:
        again = tasks.import_tasks(session, BlobStore(ctx.settings.blob_dir), [folder])
        assert [r.created for r in again] == [False]


def test_inspection_writes_no_bytecode_into_the_family_folder(tmp_path: Path) -> None:
    """The family imports its assets' scorer when inspected: Python must not leave __pycache__
    in the author's folder (-I ignores PYTHONDONTWRITEBYTECODE; -B does not)."""
    folder = write_family(tmp_path)
    inspect_family(folder, stored_files(folder))
    assert [p for p in folder.rglob("*") if "__pycache__" in p.parts] == []


def test_a_changed_family_is_refused_saying_how_a_family_gets_new_ids(
    ctx: Context, tmp_path: Path
) -> None:
    folder = write_family(tmp_path)
    _import(ctx, folder)
    source = (folder / "fastfn.py").read_text()
    (folder / "fastfn.py").write_text(source.replace("(fewer calls)", "(fewest calls)"))
    with pytest.raises(Conflict, match="exists with different content") as refused:
        _import(ctx, folder)
    assert "new id" not in str(refused.value)
    assert "task ids come from its folder's name" in str(refused.value)
    assert "fastfn_v2/fastfn_v2.py" in str(refused.value)


def test_unsupported_standard_version_is_refused(ctx: Context, tmp_path: Path) -> None:
    folder = write_family(tmp_path, version="0.1.0")
    with pytest.raises(InvalidInput, match=r"version '0.1.0' is not supported"):
        _import(ctx, folder)
    with ctx.session() as session:
        assert tasks.list_tasks(session) == []


def test_family_without_reference_score_is_refused(ctx: Context, tmp_path: Path) -> None:
    folder = write_family(tmp_path)
    source = (folder / "fastfn.py").read_text().replace('"reference_score": 1,', "")
    (folder / "fastfn.py").write_text(source)
    with pytest.raises(InvalidInput, match="no starting_score/reference_score"):
        _import(ctx, folder)


def test_family_code_that_blocks_is_stopped_by_the_time_out(tmp_path: Path) -> None:
    folder = write_family(tmp_path)
    source = (folder / "fastfn.py").read_text()
    (folder / "fastfn.py").write_text(
        source.replace("def get_tasks():", "def get_tasks():\n        import time; time.sleep(60)")
    )
    with pytest.raises(TaskStandardError, match="ran past 2 s"):
        inspect_family(folder, stored_files(folder), timeout_s=2)


INSTALLED_PACKAGE = """\
import site
from pathlib import Path


class TaskFamily:
    standard_version = "0.3.0"

    @staticmethod
    def install():
        # As gaia's and humaneval's install() pip-install what get_tasks() imports.
        Path(site.getsitepackages()[0], "fam_data.py").write_text(
            "QUESTIONS = {'q1': 'What is 6 x 7?', 'q2': 'What is 2 + 2?'}\\n"
        )

    @staticmethod
    def get_tasks():
        import fam_data

        return {name: {"question": q} for name, q in fam_data.QUESTIONS.items()}

    @staticmethod
    def get_instructions(t):
        with open("/etc/hostname") as f:  # inspected in a container, not on the host
            return t["question"] + " (asked in " + f.read().strip() + ")"

    @staticmethod
    def score(t, submission):
        return float(submission == "42")
"""


def test_family_importing_what_its_install_provides_is_inspected_after_install(
    ctx: Context, tmp_path: Path
) -> None:
    """get_tasks() imports a module only install() provides: inspected on the host, before
    install(), it could not be imported; in a container of the family's image it is."""
    folder = tmp_path / "fam_installed"
    folder.mkdir()
    (folder / "fam_installed.py").write_text(INSTALLED_PACKAGE)
    (folder / "baseline_scoring.yaml").write_text("normalise: false\n")
    imported = _import(ctx, folder)
    assert sorted(t.slug for t in imported) == ["fam_installed-q1", "fam_installed-q2"]
    with ctx.session() as session:
        task = session.scalars(select(Task).where(Task.slug == "fam_installed-q1")).one()
        text = tasks.read_task_file(BlobStore(ctx.settings.blob_dir), task, "instructions.md")
    assert text.startswith(b"What is 6 x 7? (asked in ")
    assert f"(asked in {socket.gethostname()})".encode() not in text


def test_an_install_that_fails_refuses_the_import_saying_so(ctx: Context, tmp_path: Path) -> None:
    folder = tmp_path / "fam_installed"
    folder.mkdir()
    source = INSTALLED_PACKAGE.replace(
        "# As gaia's", "raise RuntimeError('no network for the download')\n        # As gaia's"
    )
    (folder / "fam_installed.py").write_text(source)
    with pytest.raises(
        InvalidInput, match=r"family fam_installed: its image could not be built"
    ) as refused:
        _import(ctx, folder)
    assert "no network for the download" in str(refused.value)
    with ctx.session() as session:
        assert tasks.list_tasks(session) == []


def _study_with(
    ctx: Context, folder: Path, *, profile: str = "cpu", egress: str = "none", name: str = "family"
) -> tuple[int, int]:
    (task,) = _import(ctx, folder)
    with ctx.session() as session:
        study = studies.create_study(
            session,
            studies.StudySpec(name=name, egress_policy=egress, hardware_profile=profile),
            None,
        )
        stored = session.get(Task, task.id)
        assert stored is not None
        studies.add_task(session, study, stored, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(session, study, "agent", "basic", "m", "", None, None)
        return study.id, studies.create_attempt(session, agent, stored, None).id


GPU_MANIFEST = """\
tasks:
  main:
    resources:
      gpu: {count_range: [1, 1], model: a10}
      cpus: 4
      memory_gb: 16
"""


def test_gpu_manifest_is_refused_on_a_host_without_gpus(ctx: Context, tmp_path: Path) -> None:
    folder = write_family(tmp_path, manifest=GPU_MANIFEST)
    _, attempt_id = _study_with(ctx, folder, profile="a10")
    with ctx.session() as session:
        task = session.scalars(select(Task)).one()
        assert task.scoring is not None
        assert task.scoring["task_standard"]["hardware_profile"] == "a10"
        workspaces.add_host(session, "cpu-only", LOCAL_URL, None)
    with pytest.raises(InvalidInput, match=r"needs 1 GPU\(s\) \(a10\) and no enabled host"):
        launch.launch(ctx, attempt_id, None, image="unused")
    with ctx.session() as session:
        assert session.scalars(select(Workspace)).all() == []


def _refused_everywhere(
    ctx: Context,
    monkeypatch: pytest.MonkeyPatch,
    folder: Path,
    message: str,
    *,
    profile: str = "cpu",
    egress: str = "none",
) -> None:
    """A family task the study cannot run is refused when added to the study, when an agent is
    enrolled (a study holding it from before the rule) and at launch, each time saying why."""
    (task,) = _import(ctx, folder)
    with ctx.session() as session:
        study = studies.create_study(
            session,
            studies.StudySpec(name="family", egress_policy=egress, hardware_profile=profile),
            None,
        )
        stored = session.get(Task, task.id)
        assert stored is not None
        with pytest.raises(InvalidInput, match=rf"task fastfn-main cannot run in .*{message}"):
            studies.add_task(session, study, stored, None)
        assert studies.study_tasks(session, study) == []
        session.add(StudyTask(study=study, task=stored))
        session.flush()
        session.refresh(study)
        with pytest.raises(InvalidInput, match=message):
            agent_enrolment.enrol(
                session, study, name="agent", scaffold="basic", model="m",
                endpoint="http://127.0.0.1:9/v1", runs_per_task=1, actor_id=None,
                settings={"input_usd_per_mtok": 1, "output_usd_per_mtok": 1},
            )  # fmt: skip
        monkeypatch.setattr(studies, "check_runnable", lambda study, task: None)
        agent = studies.add_agent(session, study, "agent", "basic", "m", "", None, None)
        attempt_id = studies.create_attempt(session, agent, stored, None).id
    with pytest.raises(InvalidInput, match=message):
        launch.launch(ctx, attempt_id, None, image="unused")


def test_study_profile_must_give_the_manifest_resources(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_family(tmp_path, manifest=GPU_MANIFEST)
    message = r"profile 'cpu' does not give it \(profile 'a10'"
    _refused_everywhere(ctx, monkeypatch, folder, message, profile="cpu")


@pytest.mark.parametrize(
    ("permissions", "egress", "message"),
    [
        ((), "blacklist", "does not ask for full_internet"),
        (("full_internet",), "none", "asks for full_internet but the study's egress policy"),
    ],
)
def test_permissions_must_agree_with_the_egress_policy(
    ctx: Context,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    permissions: tuple[str, ...],
    egress: str,
    message: str,
) -> None:
    folder = write_family(tmp_path, permissions=permissions)
    _refused_everywhere(ctx, monkeypatch, folder, message, egress=egress)


def test_required_environment_variables_are_refused_clearly(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_family(tmp_path)
    source = (folder / "fastfn.py").read_text()
    needs = 'standard_version = "0.3.0"\n    required_environment_variables = ["HF_TOKEN"]'
    (folder / "fastfn.py").write_text(source.replace("standard_version = '0.3.0'", needs))
    _refused_everywhere(ctx, monkeypatch, folder, "needs environment variables HF_TOKEN")


# -- real Docker --------------------------------------------------------------------------------


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@pytest.fixture
def local_host(ctx: Context) -> Iterator[None]:
    docker_url("unix")
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", LOCAL_URL, None)
        assert workspaces.check_host(session, host).healthy
    yield
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def _exec(ctx: Context, attempt_id: int, script: str, user: str = PARTICIPANT_USER) -> bytes:
    with ctx.session() as session:
        query = select(Workspace).where(Workspace.attempt_id == attempt_id)
        handle = workspaces.handle_of(session.scalars(query).one())
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["bash", "-c", script], user=user, timeout_s=60)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.docker
@pytest.mark.sqlite_only("the family's container and score")
def test_family_attempt_is_started_scored_and_normalised(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    study_id, attempt_id = _study_with(ctx, write_family(tmp_path))
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING

    # start(task) ran as root: the starting solution is in the submission, the participant's own.
    owner = _exec(ctx, attempt_id, "stat -c %U /home/submission/solution.py")
    assert owner.strip() == PARTICIPANT_USER.encode()
    # install() ran as root when the family's image was built on the workspace image.
    assert _exec(ctx, attempt_id, "cat /opt/fastfn-installed") == b"installed at image build\n"
    with ctx.session() as session:
        workspace = session.scalars(select(Workspace)).one()
        assert workspace.image.startswith("baseline-family:fastfn-")
    # The family (and its scorer) is in the workspace only under /root, which the participant
    # cannot read; root can.
    denied = _exec(
        ctx,
        attempt_id,
        "for p in /root /root/fastfn.py /root/assets/scorer.py; do "
        'cat "$p" >/dev/null 2>&1 || ls "$p" >/dev/null 2>&1 && echo "READ $p"; done; true',
    )
    assert b"READ" not in denied
    assert b"calls_of" in _exec(ctx, attempt_id, "cat /root/assets/scorer.py", "root")

    first = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)
    assert first.error is None
    assert (first.raw_score, first.normalised_score) == (202.0, 0.0)

    encoded = base64.b64encode(REFERENCE.encode()).decode()
    _exec(ctx, attempt_id, f"echo {encoded} | base64 -d > /home/submission/solution.py")
    second = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)
    assert second.error is None
    assert (second.raw_score, second.normalised_score) == (1.0, 1.0)
    assert second.working_s >= first.working_s

    final = attempts.submit(ctx, attempt_id, None, resolve_source, backend_factory=factory)
    # The attempt ended: the family's teardown(task) ran as root in its workspace, which was then
    # stopped (an agent's: kept, with what teardown wrote).
    with ctx.session() as session:
        query = select(Workspace).where(Workspace.attempt_id == attempt_id)
        handle = workspaces.handle_of(session.scalars(query).one())
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        assert backend.status(handle) is WorkspaceState.STOPPED
        archive = backend.get_archive(handle, "/root/torn-down")
    finally:
        backend.close()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        torn_down = tar.extractfile("torn-down")
        assert torn_down is not None and torn_down.read() == b"200"
    with ctx.session() as session:
        snapshot = script_scoring.snapshot_of(session, final.id)
        grading_id = script_scoring.create_script_grading(session, snapshot).id
    grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
    assert grading.status is JobStatus.SUCCEEDED, grading.error
    assert (grading.raw_score, grading.score) == (1.0, 1.0)
    # The analysis table has the family's task like any scored task: its intermediate scores
    # over working time and its final graded snapshot.
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        table = build_table(session, study)
    mine = table[table["task"] == "fastfn-main"]
    logged = mine[mine["source"] == SOURCE_SCORE_LOG].sort_values("working_hours")
    assert list(logged["score"]) == [0.0, 1.0]
    assert list(mine[mine["source"] == SOURCE_SNAPSHOT]["score"].dropna()) == [1.0]


@pytest.mark.docker
def test_family_whose_start_raises_fails_the_attempt(
    ctx: Context, tmp_path: Path, test_image: str, local_host: None
) -> None:
    folder = write_family(tmp_path, start='raise RuntimeError("no data for this task")')
    _, attempt_id = _study_with(ctx, folder)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.FAILED
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.ended_at is not None
        assert attempt.end_reason is not None
        assert "fastfn.start(main) failed" in attempt.end_reason
        assert "RuntimeError: no data for this task" in attempt.end_reason
        statuses = session.scalars(select(Workspace.status)).all()
        assert statuses == [WorkspaceStatus.DESTROYED]


@pytest.mark.docker
def test_attempt_launch_command_exits_non_zero_when_start_fails(
    ctx: Context,
    tmp_path: Path,
    test_image: str,
    local_host: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = write_family(tmp_path, start='raise RuntimeError("no data for this task")')
    _, attempt_id = _study_with(ctx, folder)
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["attempt", "launch", str(attempt_id), "--image", test_image])
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert err.startswith(f"error: attempt {attempt_id} failed to start: fastfn.start(main) failed")
    assert "RuntimeError: no data for this task" in err and "Traceback" not in err


def test_task_import_command_imports_a_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASELINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BASELINE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    main(["init", "--admin-password", "a-long-password"])
    folder = write_family(tmp_path / "good")
    source = (folder / "fastfn.py").read_text()
    second = '"big": {"n": 400, "starting_score": 402, "reference_score": 1}, "main":'
    (folder / "fastfn.py").write_text(source.replace('"main":', second))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:  # "big" gives no score_direction: higher
        main(["task", "import", str(folder)])
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == (
        "error: family fastfn: task 'big': direction is 'higher' but reference_score 1.0 < "
        "starting_score 402.0"
    )
    second = second.replace(
        '"reference_score": 1}', '"reference_score": 1, "score_direction": "lower"}'
    )
    (folder / "fastfn.py").write_text(source.replace('"main":', second))
    main(["task", "import", str(folder), "--json"])
    rows = json.loads(capsys.readouterr().out)["tasks"]
    assert [r["slug"] for r in rows] == ["fastfn-big", "fastfn-main"]
    assert all(r["files_by_visibility"] == {"participant": 1, "protected": 4} for r in rows)
    old = write_family(tmp_path / "old", version="0.1.0")
    with pytest.raises(SystemExit) as exited:
        main(["task", "import", str(old)])
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert "Task Standard version '0.1.0' is not supported" in err and "Traceback" not in err
