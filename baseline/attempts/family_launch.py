"""Launching attempts of Task Standard family tasks: checks, the family's image, start, teardown.

A family gets its own image, built on the profile's workspace image with the Task Standard's
``metr_task_standard`` package, the family in ``/root`` (where the Task Standard puts it) and
``install()`` (if any) run as root (cached by content, like the workspace images).
Launching an attempt of a family task checks, before any
workspace is made, that the study's hardware profile gives the manifest's resources, that some
host has the GPUs asked for, that the task's ``full_internet`` permission agrees with the study's
egress policy, and that the family needs no environment variables (Baseline has no per-study
secrets to give it yet). Once the workspace is placed, the family code is copied to ``/root``
(root only: the participant cannot read it; the family's own code finds ``/root/assets``) and
``start(task)`` runs as root in a short-lived setup container of the workspace's image, with the
workspace's GPUs and, only for a task that asks for ``full_internet``, its network and egress
proxy (else no network: `StartReach`), the only place given `START_CAPABILITIES`: root in the
workspace has none, and RE-Bench's start ``chown``s to ``agent`` and runs commands as ``agent``
(the participant's uid, see `infra.image_build`). What start changed there (anywhere:
``/root``, ``/opt``, ``/etc/group``) is then copied into the workspace by the engine, owners and
modes kept (the proxy's CA files it was given are the workspace's already); what it puts in
``/home/agent``, the Task Standard's agent home, is moved into Baseline's submission directory
``/home/submission`` (the participant's), and ``/home/agent`` becomes a link to it. A ``start``
that fails leaves the attempt FAILED with the error as its end reason, never stuck. When the
attempt ends, the workspace's state is saved for the final score (taken in it, as Vivaria scores
before teardown: `baseline.grading.family_environment`), then ``teardown(task)`` (if the family
has one) runs as root in the workspace; a failure of either is recorded on the attempt (it has
ended already).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import DockerException
from docker.models.containers import Container
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.errors import DomainError, InvalidInput
from baseline.models import (
    Attempt,
    AttemptStatus,
    FileVisibility,
    Host,
    TaskFile,
    Workspace,
    utcnow,
)
from baseline.tasks.task_families import FAMILY_DIR, standard_of
from baseline.workspaces import egress_gateway, gpu_allocation, workspaces
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.egress import setup
from infra.family_run import FamilyRunError, archive_of, changes, run_once
from infra.hardware import ProfileConfigError, load_profiles
from infra.image_build import ImageBuildError, build_family_image
from infra.workspace import (
    PARTICIPANT_USER,
    SUBMISSION_DIR,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
)
from scoring.scoring_run import ScoringError
from scoring.task_standard import (
    AGENT_HOME,
    FULL_INTERNET,
    HOOK_NAME,
    Resources,
    study_refusals,
)
from scoring.task_standard_scoring import save_final_state

WORKSPACE_FAMILY_DIR = "/root"
START_TIMEOUT_S = 600.0
DEFAULT_MEMORY_MB = 4096  # a profile no longer configured
# What the Task Standard's start needs as root (RE-Bench's `chown agent:agent`, `runuser -u
# agent`, files of any owner): given to start's own short-lived setup container only, never to
# the participant's workspace.
START_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID")
END_REASON_MAX = 200


class FamilyHookError(DomainError):
    """A family hook (start) failed in the workspace; the message carries its output's tail."""


def _gpu_hosts(session: Session, resources: Resources) -> list[str]:
    assert resources.gpu is not None
    wanted, model = resources.gpu.count_range[0], (resources.gpu.model or "").lower()
    fitting = []
    hosts = session.scalars(select(Host).where(Host.enabled.is_(True)).order_by(Host.name))
    for host in hosts:
        try:
            devices = gpu_allocation.inventory(host)
        except InvalidInput:
            continue
        if sum(1 for d in devices if model in d.model.lower()) >= wanted:
            fitting.append(host.name)
    return fitting


def check_launch(session: Session, attempt: Attempt) -> None:
    """Refuse, with a message saying why, an attempt of a family task that could not run right."""
    standard = standard_of(attempt)
    if standard is None:
        return
    slug, study = attempt.task.slug, attempt.study
    try:
        profiles = load_profiles()
    except ProfileConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    refusals = study_refusals(
        standard, attempt.hardware_profile, profiles, study.egress_policy.value
    )
    if refusals:
        raise InvalidInput(f"task {slug} {refusals[0]}")
    resources = Resources.model_validate(standard.get("resources", {}))
    if resources.gpu is not None and not _gpu_hosts(session, resources):
        count, model = resources.gpu.count_range[0], resources.gpu.model or "any model"
        raise InvalidInput(
            f"task {slug} needs {count} GPU(s) ({model}) and no enabled host has them: "
            "the attempt cannot be placed (add a GPU host)"
        )


def family_image(
    session: Session, store: BlobStore, attempt: Attempt, base: str, engine_url: str
) -> str:
    """The image an attempt of a family task runs in: `base` itself for other tasks; for a family,
    `base` with the Task Standard's package and the family installed at build time (install(),
    if it has one), built once on the local engine, as it was built to inspect it."""
    standard = standard_of(attempt)
    if standard is None:
        return base
    files = _family_files(session, store, attempt)
    try:
        client = docker.DockerClient(base_url=engine_url, use_ssh_client=False)
    except DockerException as exc:
        raise InvalidInput(f"the local Docker Engine is not reachable: {exc}") from exc
    try:
        built = build_family_image(
            client, base, standard["family"], files, HOOK_NAME, family_dir=WORKSPACE_FAMILY_DIR
        )
    except (ImageBuildError, DockerException) as exc:
        raise InvalidInput(f"task {attempt.task.slug}: {exc}") from exc
    finally:
        client.close()
    return built.tag


def _family_tar(files: dict[str, bytes]) -> bytes:
    """The family's files as a tar rooted at root/, owned by root, readable by root only.

    Only the top folder is closed (0700); inside it modes are the usual 0755/0644, so what start
    copies from it stays readable once it is the participant's (root here has no capabilities:
    it could not read a participant's 0600 file when scoring).
    """
    root = WORKSPACE_FAMILY_DIR.rsplit("/", 1)[-1]
    buffer = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dir(name: str) -> None:
            if name not in made:
                made.add(name)
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o700 if name == root else 0o755
                tar.addfile(info)

        add_dir(root)
        for path in sorted(files):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                add_dir("/".join([root, *parts[:depth]]))
            info = tarfile.TarInfo(f"{root}/{path}")
            info.size, info.mode = len(files[path]), 0o644
            tar.addfile(info, io.BytesIO(files[path]))
    return buffer.getvalue()


def _family_files(session: Session, store: BlobStore, attempt: Attempt) -> dict[str, bytes]:
    prefix = f"{FAMILY_DIR}/"
    rows = session.scalars(
        select(TaskFile).where(
            TaskFile.task_id == attempt.task_id, TaskFile.visibility == FileVisibility.PROTECTED
        )
    )
    return {
        row.path.removeprefix(prefix): store.get_bytes(row.sha256)
        for row in rows
        if row.path.startswith(prefix)
    }


def run_start(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> None:
    """Copy the family to /root in the attempt's workspace and run start as root."""
    store = BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        standard = standard_of(attempt)
        if standard is None:
            return
        workspace = workspaces.running_attempt_workspace(session, attempt_id)
        if workspace is None or workspace.host_id is None:
            raise FamilyHookError(f"attempt {attempt_id} has no running workspace to start in")
        host = session.get(Host, workspace.host_id)
        assert host is not None
        handle = workspaces.handle_of(workspace)
        files = _family_files(session, store, attempt)
        image = handle.image_digest or workspace.image
        memory_mb = _memory_mb(attempt.hardware_profile)
        reach = _start_reach(session, standard, workspace)
    family, task = standard["family"], standard["task"]
    command = ["python3", "-B", f"{WORKSPACE_FAMILY_DIR}/{HOOK_NAME}", family, "start", task]
    backend = backend_factory(host)
    try:
        if not isinstance(backend, DockerBackend):
            raise FamilyHookError("a family's start runs in a container: it needs a Docker host")
        network, dns = backend.network_mode(reach.network)
        backend.put_archive(
            handle, WORKSPACE_FAMILY_DIR.rsplit("/", 1)[0] or "/", _family_tar(files)
        )
        result = run_once(
            backend.client,
            image,
            command,
            workdir=WORKSPACE_FAMILY_DIR,
            timeout_s=START_TIMEOUT_S,
            cap_add=START_CAPABILITIES,
            memory=f"{memory_mb}m",
            after=lambda container: _carry(container, backend, handle),
            network=network,
            dns=dns,
            environment=reach.env,
            gpu_ids=reach.gpu_ids,
            archive=_proxy_trust(backend, handle) if reach.proxied else None,
        )
    except (WorkspaceError, FamilyRunError) as exc:
        raise FamilyHookError(f"the family's start could not run: {exc}") from exc
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    if result.exit_code != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        timed_out = result.exit_code is None
        how = f"ran past {START_TIMEOUT_S:g} s" if timed_out else f"exit {result.exit_code}"
        last = lines[-1] if lines else "no output"  # a traceback's last line names the error
        raise FamilyHookError(f"{family}.start({task}) failed ({how}): {last}")


@dataclass(frozen=True)
class StartReach:
    """What of its workspace's reach a family's start gets, as Vivaria's start has it in the
    task's own environment: the workspace's GPUs always; its network and environment (the
    study's egress proxy) only when the task asks for ``full_internet``, which launch checked
    the study's egress policy gives (`check_launch`), else no network. Never more than the
    workspace has: both come from the workspace's own row."""

    network: str  # "none": no network
    env: dict[str, str]
    proxied: bool  # through the egress proxy: start must trust its CA as the workspace does
    gpu_ids: list[str]


def _start_reach(session: Session, standard: dict[str, Any], workspace: Workspace) -> StartReach:
    gpu_ids = gpu_allocation.device_ids_of(gpu_allocation.live_assignments(session, workspace))
    if FULL_INTERNET not in standard.get("permissions", []):
        return StartReach(network="none", env={}, proxied=False, gpu_ids=gpu_ids)
    return StartReach(
        network=workspace.network,
        env=dict(workspace.env or {}),
        proxied=egress_gateway.proxied(workspace),
        gpu_ids=gpu_ids,
    )


def _proxy_trust(backend: WorkspaceBackend, handle: WorkspaceHandle) -> bytes:
    """The files that make the workspace trust the egress proxy's CA (`infra.egress.setup`), for
    start's setup container: they were put into the workspace once it existed, so its image has
    not got them. Made from the workspace's own CA and system bundle, as `setup.install` made
    them."""
    ca = setup.read_file(backend, handle, setup.PROXY_CA)
    if ca is None:
        raise WorkspaceError(f"the workspace has no egress proxy CA at {setup.PROXY_CA}")
    try:
        return setup.archive(ca, setup.read_file(backend, handle, setup.SYSTEM_BUNDLE) or b"")
    except ValueError as exc:  # not a PEM certificate
        raise WorkspaceError(f"the workspace's {setup.PROXY_CA}: {exc}") from exc


def _memory_mb(profile_name: str) -> int:
    try:
        profile = load_profiles().get(profile_name)
    except ProfileConfigError:
        profile = None
    return DEFAULT_MEMORY_MB if profile is None else profile.memory_mb


def _carry(container: Container, backend: WorkspaceBackend, handle: WorkspaceHandle) -> None:
    """Copy what start changed in its setup container into the workspace, owners and modes as
    start left them (the engine writes them; root in the workspace could not), its
    /home/agent into the submission (`_hand_over_agent_home`)."""
    found = changes(container)
    carried = [(p, True) for p in found.added] + [(p, False) for p in found.changed]
    for path, whole in carried:
        if path == AGENT_HOME or path.startswith(AGENT_HOME + "/"):
            continue
        with archive_of(container, path, whole=whole) as archive:
            if archive is not None:
                backend.put_archive(handle, path.rsplit("/", 1)[0] or "/", archive)
    if found.deleted:
        removed = backend.exec(handle, ["rm", "-rf", "--", *found.deleted], user="root")
        if removed.exit_code != 0:
            raise WorkspaceError(f"removing what start deleted failed: {removed.output[-300:]!r}")
    with archive_of(container, AGENT_HOME, whole=True) as agent_home:
        assert agent_home is not None
        _hand_over_agent_home(backend, handle, agent_home.read())


def run_teardown(
    ctx: Context,
    attempt_id: int,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> str | None:
    """Save the ended family attempt's environment for its final score, then run the family's
    teardown(task) as root in its workspace, if it has one.

    Vivaria scores a family before its teardown, in the environment the task ran in: the
    workspace's state is saved first (`scoring.task_standard_scoring.save_final_state`) and the
    final snapshot is scored in it (`baseline.grading.family_environment`). The attempt has
    ended already, so a failure cannot undo that: it is recorded on the attempt (audit
    ``attempt.teardown_failed``) and returned, never raised.
    """
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        standard = None if attempt is None else standard_of(attempt)
        if standard is None:
            return None
        workspace = workspaces.running_attempt_workspace(session, attempt_id)
        host = None if workspace is None else session.get(Host, workspace.host_id)
        handle = None if workspace is None else workspaces.handle_of(workspace)
    family, task = standard["family"], standard["task"]
    tears_down = "teardown" in standard.get("hooks", [])
    errors: list[str] = []
    if host is None or handle is None:
        if tears_down:
            errors.append("the attempt has no running workspace to tear down in")
    else:
        backend = backend_factory(host)
        try:
            client = getattr(backend, "client", None)
            if isinstance(client, docker.DockerClient) and handle.container_id:
                try:
                    save_final_state(client, handle.container_id)
                except ScoringError as exc:
                    errors.append(f"saving its environment for the final score failed: {exc}")
            if tears_down:
                errors.extend(_teardown(backend, handle, family, task))
        finally:
            close = getattr(backend, "close", None)
            if callable(close):
                close()
    if not errors:
        return None
    error = f"{family}({task}) at the attempt's end: {'; '.join(errors)}"
    with ctx.session() as session:
        audit.record(session, "attempt.teardown_failed", "attempt", attempt_id, None, error=error)
    return error


def _teardown(
    backend: WorkspaceBackend, handle: WorkspaceHandle, family: str, task: str
) -> list[str]:
    command = ["python3", f"{WORKSPACE_FAMILY_DIR}/{HOOK_NAME}", family, "teardown", task]
    try:
        result = backend.exec(
            handle, command, user="root", workdir=WORKSPACE_FAMILY_DIR, timeout_s=300
        )
    except WorkspaceError as exc:
        return [str(exc)]
    if result.timed_out or result.exit_code != 0:
        lines = result.output.decode("utf-8", "replace").strip().splitlines()
        return [lines[-1] if lines else f"exit {result.exit_code}"]
    return []


def _rerooted(tar: bytes, old: str, new: str, uid: int, gid: int) -> bytes:
    """The archive with its top folder renamed from `old` to `new`; the folder itself and every
    member start left root's (root:root) become uid:gid, the participant's (a Vivaria family
    writes the agent's starting files as root and expects the agent to edit them); a member start
    gave another owner keeps it (RE-Bench's ``chown agent``, or ``root:protected`` for a file
    the agent may read but not change)."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source:
            if member.name != old and not member.name.startswith(old + "/"):
                continue
            if member.name == old or (member.uid, member.gid) == (0, 0):
                member.uid, member.gid = uid, gid
            member.name = new + member.name[len(old) :]
            member.uname = member.gname = ""
            data = source.extractfile(member) if member.isfile() else None
            target.addfile(member, data)
    return out.getvalue()


def _hand_over_agent_home(backend: WorkspaceBackend, handle: WorkspaceHandle, tar: bytes) -> None:
    """Put what start wrote to /home/agent (`tar`, from its setup container) into the submission
    (`_rerooted` says the owners); /home/agent then becomes a link to it.

    Start ran in its own container, which cannot write into the participant's volume; the engine
    copies it in. (Carried into the workspace as it was, root there could not remove it.)
    """
    ids = backend.exec(
        handle, ["sh", "-c", f"id -u {PARTICIPANT_USER}; id -g {PARTICIPANT_USER}"], timeout_s=60
    )
    uid, gid = (int(v) for v in ids.output.decode().split())
    agent_home = AGENT_HOME.rsplit("/", 1)[-1]
    submission = SUBMISSION_DIR.rsplit("/", 1)[-1]
    backend.put_archive(
        handle, SUBMISSION_DIR.rsplit("/", 1)[0], _rerooted(tar, agent_home, submission, uid, gid)
    )
    linked = backend.exec(
        handle,
        ["sh", "-c", f"rm -rf {AGENT_HOME} && ln -s {SUBMISSION_DIR} {AGENT_HOME}"],
        user="root",
        timeout_s=60,
    )
    if linked.exit_code != 0:
        raise WorkspaceError(f"linking {AGENT_HOME} to {SUBMISSION_DIR} failed")


def fail_attempt(
    ctx: Context,
    attempt_id: int,
    error: str,
    actor_id: int | None,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> None:
    """End the attempt as FAILED with the error shown (end reason, audit), free its workspace."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.FAILED
        attempt.ended_at = utcnow()
        attempt.end_reason = error[:END_REASON_MAX]
        audit.record(session, "attempt.fail", "attempt", attempt_id, actor_id, error=error)
        for workspace in workspaces.live_workspaces(session):
            if workspace.attempt_id == attempt_id:
                workspaces.destroy(session, workspace, backend_factory, actor_id=actor_id)


def start_family(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> bool:
    """Run the family's start for a placed attempt; False (attempt FAILED) when it failed."""
    try:
        run_start(ctx, attempt_id, backend_factory)
    except FamilyHookError as exc:
        fail_attempt(ctx, attempt_id, str(exc), actor_id, backend_factory)
        return False
    return True
