"""The local sandbox backend: bubblewrap namespaces plus cgroup v1 limits, for machines without
Docker.

Run as root (cgroups). A workspace is a directory on the host (state, home, logs, files put
under /etc) and a submission directory (a git repository) kept apart so that it outlives the
sandbox. Every `exec` runs one `bwrap --unshare-all` sandbox over the host's userland, read-only
(`image` must be "host"): the participant is uid 1000, not root; /home/paper is a read-only bind
of the task directory; /home/submission and /home/logs are writable binds; `none` networking
leaves only a private loopback, any other network shares the host's (egress is then the proxy's
job, set through the environment: the local backend is for development and cannot stop a direct
connection). Background processes end with the exec that started them (one pid namespace each).
Limits are the workspace's cgroups (memory, pids, cpu), bound at /sys/fs/cgroup/<controller>
inside so that they are visible from within, as in a container.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any

from infra.workspace import (
    DEFAULT_MAX_OUTPUT_BYTES,
    LOGS_DIR,
    ORPHAN_MIN_AGE_S,
    PAPER_DIR,
    SUBMISSION_DIR,
    Archive,
    ExecResult,
    OutputSink,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
    WorkspaceState,
)

HOST_IMAGE = "host"
PARTICIPANT_UID = 1000
HOME_DIR = "/home/participant"
SCORING_TASK_DIR = "/home/task"  # where scoring.scoring_run puts a task's scoring files
CONTROLLERS = ("memory", "pids", "cpu")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ROOT_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
_CPU_PERIOD_US = 100_000
_MIB = 1024 * 1024


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise WorkspaceError(f"workspace name {name!r}: use letters, digits, '-', '_' and '.'")


class LocalSandboxBackend:
    """Workspaces under `root`, cgroups under `cgroup_root/<controller>/<cgroup_parent>/<name>`."""

    name = "local"

    def __init__(
        self,
        root: Path,
        *,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        cgroup_parent: str = "baseline",
        bwrap: str = "bwrap",
        ro_binds: Sequence[Path] = (),
        path_prefix: Sequence[str] = (),
    ) -> None:
        """`ro_binds` are host directories shown read-only at the same path (a Python
        environment with the task's libraries, say); `path_prefix` goes before the PATH."""
        self.root = root
        self.cgroup_root = cgroup_root
        self.cgroup_parent = cgroup_parent
        self.bwrap = shutil.which(bwrap) or bwrap
        self.ro_binds = tuple(ro_binds)
        self.path = ":".join([*path_prefix, PATH])

    # -- layout -----------------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        return self.root / "workspaces" / name

    def _submission(self, volume: str) -> Path:
        return self.root / "submissions" / volume

    def submission_dir(self, volume: str) -> Path:
        """Where a submission volume lives on this machine (snapshots read it directly)."""
        return self._submission(volume)

    def _cgroup(self, controller: str, name: str) -> Path:
        return self.cgroup_root / controller / self.cgroup_parent / name

    def _meta(self, name: str) -> dict[str, Any]:
        path = self._dir(name) / "meta.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise WorkspaceError(f"workspace {name} does not exist") from exc
        return data

    def _save_meta(self, name: str, meta: Mapping[str, Any]) -> None:
        path = self._dir(name) / "meta.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)

    # -- lifecycle --------------------------------------------------------------------------

    def create(self, spec: WorkspaceSpec) -> WorkspaceHandle:
        _check_name(spec.name)
        if spec.image != HOST_IMAGE:
            raise WorkspaceError(
                f"the local backend runs the host's userland (image {HOST_IMAGE!r}), "
                f"not {spec.image!r}"
            )
        if spec.gpu_device_ids:
            raise WorkspaceError("the local backend cannot give a workspace GPUs")
        if spec.task_dir is not None and not spec.task_dir.is_dir():
            raise WorkspaceError(f"task directory {spec.task_dir} does not exist")
        directory = self._dir(spec.name)
        if directory.exists():
            raise WorkspaceError(f"workspace {spec.name} already exists")
        volume = spec.submission_volume or f"{spec.name}-submission"
        _check_name(volume)
        submission = self._submission(volume)
        for sub in ("home", "logs", "overlay/etc", "tmp", "task"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(directory / "tmp", 0o1777)
        if not submission.exists():
            submission.mkdir(parents=True)
            _init_git(submission)
        self._write_passwd(directory / "overlay/etc")
        self._make_cgroups(spec)
        meta = {
            "created": time.time(),
            "state": WorkspaceState.CREATED.value,
            "submission_volume": volume,
            "spec": {
                "name": spec.name,
                "image": spec.image,
                "profile": asdict(spec.profile),
                "labels": dict(spec.labels),
                "task_dir": str(spec.task_dir) if spec.task_dir else None,
                "network": spec.network,
                "env": dict(spec.env),
            },
        }
        self._save_meta(spec.name, meta)
        return WorkspaceHandle(
            name=spec.name,
            backend=self.name,
            container_id=str(directory),
            image_digest=HOST_IMAGE,  # the host userland: what reproductions pin
            submission_volume=volume,
        )

    def _write_passwd(self, etc: Path) -> None:
        passwd = Path("/etc/passwd").read_text().rstrip("\n")
        group = Path("/etc/group").read_text().rstrip("\n")
        if f":{PARTICIPANT_UID}:" not in passwd:
            passwd += f"\nparticipant:x:{PARTICIPANT_UID}:{PARTICIPANT_UID}::{HOME_DIR}:/bin/sh"
            group += f"\nparticipant:x:{PARTICIPANT_UID}:"
        (etc / "passwd").write_text(passwd + "\n")
        (etc / "group").write_text(group + "\n")

    def _make_cgroups(self, spec: WorkspaceSpec) -> None:
        profile = spec.profile
        values = {
            "memory": {"memory.limit_in_bytes": str(profile.memory_mb * _MIB)},
            "pids": {"pids.max": str(profile.pids)},
            "cpu": {
                "cpu.cfs_period_us": str(_CPU_PERIOD_US),
                "cpu.cfs_quota_us": str(max(1000, int(profile.cpus * _CPU_PERIOD_US))),
            },
        }
        for controller in CONTROLLERS:
            path = self._cgroup(controller, spec.name)
            try:
                path.mkdir(parents=True, exist_ok=True)
                for key, value in values[controller].items():
                    (path / key).write_text(value)
            except OSError as exc:
                raise WorkspaceError(
                    f"cgroup v1 {controller} limits cannot be set at {path}: {exc.strerror}; "
                    "the local backend needs writable cgroup v1 controllers (run as root)"
                ) from exc

    def start(self, handle: WorkspaceHandle) -> None:
        meta = self._meta(handle.name)
        meta["state"] = WorkspaceState.RUNNING.value
        self._save_meta(handle.name, meta)

    def status(self, handle: WorkspaceHandle) -> WorkspaceState:
        try:
            return WorkspaceState(self._meta(handle.name)["state"])
        except WorkspaceError:
            return WorkspaceState.MISSING

    def _kill_all(self, name: str) -> None:
        """SIGKILL every process of the workspace (its cgroup), until none is left."""
        procs = self._cgroup("pids", name) / "cgroup.procs"
        for _ in range(50):
            try:
                pids = [int(p) for p in procs.read_text().split()]
            except FileNotFoundError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        raise WorkspaceError(f"processes of workspace {name} survive SIGKILL: {procs}")

    def stop(self, handle: WorkspaceHandle) -> None:
        self._kill_all(handle.name)
        meta = self._meta(handle.name)
        meta["state"] = WorkspaceState.STOPPED.value
        self._save_meta(handle.name, meta)

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        self._kill_all(handle.name)
        for controller in CONTROLLERS:
            path = self._cgroup(controller, handle.name)
            if path.exists():
                path.rmdir()
        shutil.rmtree(self._dir(handle.name), ignore_errors=True)
        if not keep_submission:
            shutil.rmtree(self._submission(handle.submission_volume), ignore_errors=True)

    def reconcile(self, live_names: set[str], *, min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
        """Remove sandboxes with no live workspace, created at least `min_age_s` ago (see
        ORPHAN_MIN_AGE_S); their submissions are kept (the work)."""
        base = self.root / "workspaces"
        removed: list[str] = []
        for directory in sorted(base.iterdir()) if base.exists() else []:
            if directory.name in live_names or not (directory / "meta.json").exists():
                continue
            meta = self._meta(directory.name)
            if time.time() - float(meta.get("created", 0.0)) < min_age_s:
                continue
            handle = WorkspaceHandle(
                directory.name, self.name, str(directory), None, meta["submission_volume"]
            )
            self.destroy(handle, keep_submission=True)
            removed.append(directory.name)
        return removed

    # -- exec -------------------------------------------------------------------------------

    def sandbox_argv(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
    ) -> list[str]:
        """The bwrap command line of one exec (without the cgroup entry)."""
        meta = self._meta(handle.name)
        spec = meta["spec"]
        directory = self._dir(handle.name)
        uid = 0 if user in ("root", "0") else PARTICIPANT_UID
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        if spec["network"] != "none":
            argv.append("--share-net")
        argv += ["--uid", str(uid), "--gid", str(uid)]
        for entry in _ROOT_ENTRIES:
            host = Path("/") / entry
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{entry}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{entry}"]
        argv += self._etc_args(directory / "overlay/etc")
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--bind", str(directory / "tmp"), "/tmp"]
        argv += ["--dir", "/home", "--bind", str(directory / "home"), HOME_DIR]
        argv += ["--bind", str(self._submission(meta["submission_volume"])), SUBMISSION_DIR]
        argv += ["--bind", str(directory / "logs"), LOGS_DIR]
        if (directory / "task").is_dir():  # a scoring workspace's task files (scoring_run)
            argv += ["--bind", str(directory / "task"), SCORING_TASK_DIR]
        if spec["task_dir"]:
            argv += ["--ro-bind", spec["task_dir"], PAPER_DIR]
        # Last, so that an extra path under /tmp or /home (a checkout in /tmp, say) is not
        # hidden by the workspace's own /tmp and home mounted above.
        for extra in self.ro_binds:
            argv += ["--ro-bind", str(extra), str(extra)]
        for controller in CONTROLLERS:
            cgroup = self._cgroup(controller, handle.name)
            argv += ["--ro-bind", str(cgroup), f"/sys/fs/cgroup/{controller}"]
        env = {"HOME": HOME_DIR, "PATH": self.path, "USER": "participant", **spec["env"]}
        argv.append("--clearenv")
        for key, value in env.items():
            argv += ["--setenv", key, value]
        argv += ["--chdir", workdir or SUBMISSION_DIR, "--", *command]
        return argv

    def _etc_args(self, overlay: Path) -> list[str]:
        """/etc: the host's entries as symlinks into a read-only bind, the overlay's on top."""
        argv = ["--ro-bind", "/etc", "/run/host/etc", "--dir", "/etc"]
        own = {entry.name for entry in overlay.iterdir()}
        for entry in sorted(os.listdir("/etc")):
            if entry not in own:
                argv += ["--symlink", f"/run/host/etc/{entry}", f"/etc/{entry}"]
        for name in sorted(own):
            argv += ["--ro-bind", str(overlay / name), f"/etc/{name}"]
        return argv

    def exec(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        workdir: str | None = None,
        on_output: OutputSink | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run a command in a fresh sandbox inside the workspace's cgroups; stream its output."""
        state = self.status(handle)
        if state is not WorkspaceState.RUNNING:
            raise WorkspaceError(f"workspace {handle.name} is {state.value}, not running")
        sandbox = self.sandbox_argv(handle, command, user=user, workdir=workdir)
        join = " && ".join(
            f'echo $$ > "{self._cgroup(c, handle.name)}/cgroup.procs"' for c in CONTROLLERS
        )
        argv = ["/bin/sh", "-c", f'{join} && exec "$@"', "sh", *sandbox]
        started = time.monotonic()
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        kept = bytearray()
        truncated = [False]

        stream = process.stdout
        assert isinstance(stream, io.BufferedReader)

        def pump() -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                if on_output is not None:
                    on_output(chunk)
                room = max_output_bytes - len(kept)
                if len(chunk) > room:
                    truncated[0] = True
                kept.extend(chunk[: max(room, 0)])

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            exit_code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.kill()  # bwrap's death takes the sandbox's pid namespace with it
            process.wait()
            exit_code = None
        reader.join(timeout=10)
        return ExecResult(
            exit_code=exit_code,
            output=bytes(kept),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            truncated=truncated[0],
        )

    # -- files ------------------------------------------------------------------------------

    def _host_path(self, handle: WorkspaceHandle, path: str) -> Path:
        """Where a workspace path lives on the host; only the writable places are mapped."""
        meta = self._meta(handle.name)
        directory = self._dir(handle.name)
        pure = PurePosixPath(os.path.normpath(path))
        mounts = {
            PurePosixPath(SUBMISSION_DIR): self._submission(meta["submission_volume"]),
            PurePosixPath(LOGS_DIR): directory / "logs",
            PurePosixPath(HOME_DIR): directory / "home",
            PurePosixPath("/tmp"): directory / "tmp",
            PurePosixPath("/etc"): directory / "overlay/etc",
            PurePosixPath(SCORING_TASK_DIR): directory / "task",
        }
        if meta["spec"]["task_dir"]:
            mounts[PurePosixPath(PAPER_DIR)] = Path(meta["spec"]["task_dir"])
        for inside, outside in mounts.items():
            if pure == inside or inside in pure.parents:
                return outside / pure.relative_to(inside)
        raise WorkspaceError(
            f"{path} is not in a place the local backend stores: "
            f"{', '.join(sorted(str(m) for m in mounts))}"
        )

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: Archive) -> None:
        """Unpack a tar at `path`; at "/" each member must fall under a stored place. Read as a
        stream, a member at a time."""
        source = io.BytesIO(archive) if isinstance(archive, bytes) else archive
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                inside = PurePosixPath(path) / member.name
                if ".." in PurePosixPath(member.name).parts or member.name.startswith("/"):
                    raise WorkspaceError(f"archive member {member.name!r} escapes {path}")
                if inside == PurePosixPath("/etc"):
                    continue
                target = self._host_path(handle, str(inside))
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    content = tar.extractfile(member)
                    assert content is not None
                    with target.open("wb") as written:
                        shutil.copyfileobj(content, written)
                    os.chmod(target, member.mode & 0o7777)
                elif member.issym():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.symlink_to(member.linkname)
                else:
                    raise WorkspaceError(f"archive member {member.name!r} is not a file or folder")

    def get_archive(self, handle: WorkspaceHandle, path: str) -> bytes:
        source = self._host_path(handle, path)
        if not source.exists() and not source.is_symlink():
            raise WorkspaceError(f"{handle.name}:{path} does not exist")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(source, arcname=PurePosixPath(path).name or ".")
        return buffer.getvalue()


def _init_git(path: Path) -> None:
    """An empty repository. Files the host's root owns are the participant's inside: bwrap maps
    the sandbox's uid 1000 to the caller (root), which holds no capability over the host."""
    try:
        subprocess.run(
            ["git", "init", "-q", "-b", "main", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise WorkspaceError(f"git init of {path} failed: {exc}") from exc
