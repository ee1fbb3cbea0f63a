"""A workspace backend whose containers are names in a set: for races between the database's
rows and the engine (reconcile beside a destroy, a restart beside one), where what matters is
the order of the engine's calls, not a container."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baseline.models import Host
from infra.workspace import WorkspaceHandle, WorkspaceSpec, WorkspaceState


@dataclass
class FakeEngine:
    """Records its calls. `on_status` runs once, the first time a state is asked for, and
    `on_create` once, the first time a container is made (before it is started); `destroy`
    goes as the Docker backend's does (the container first, the volume with its disk image
    last) and runs `meanwhile` between the two; `stop` runs it once the container stopped."""

    name: str = "docker"
    containers: set[str] = field(default_factory=set)
    stopped: set[str] = field(default_factory=set)  # of `containers`, those not running
    calls: list[str] = field(default_factory=list)
    on_status: Callable[[], None] | None = None
    on_create: Callable[[], None] | None = None
    meanwhile: Callable[[], None] = lambda: None

    def create(self, spec: WorkspaceSpec) -> WorkspaceHandle:
        self.calls.append(f"create {spec.name}")
        self.containers.add(spec.name)
        hook, self.on_create = self.on_create, None
        if hook is not None:
            hook()
        return WorkspaceHandle(
            name=spec.name, backend=self.name, container_id=f"id-{spec.name}",
            image_digest="sha256:" + "a" * 64, submission_volume=f"{spec.name}-submission",
        )  # fmt: skip

    def start(self, handle: WorkspaceHandle) -> None:
        self.calls.append(f"start {handle.name}")
        self.stopped.discard(handle.name)

    def stop(self, handle: WorkspaceHandle) -> None:
        self.stopped.add(handle.name)
        self.calls.append(f"stop {handle.name}")
        self.meanwhile()

    def status(self, handle: WorkspaceHandle) -> WorkspaceState:
        hook, self.on_status = self.on_status, None
        if handle.name not in self.containers:
            state = WorkspaceState.MISSING
        elif handle.name in self.stopped:
            state = WorkspaceState.STOPPED
        else:
            state = WorkspaceState.RUNNING
        if hook is not None:
            hook()
        return state

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        self.containers.discard(handle.name)
        self.stopped.discard(handle.name)
        self.calls.append(f"remove container {handle.name}")
        self.meanwhile()
        self.calls.append(f"remove volume {handle.submission_volume}")

    def reconcile(self, live_names: set[str], *, min_age_s: float = 0.0) -> list[str]:
        return []

    def close(self) -> None:
        pass

    def factory(self, _host: Host) -> Any:
        """The backend factory of every host (the Protocol's other methods are not needed)."""
        return self


def destroyed(name: str) -> list[str]:
    """The calls of destroying workspace `name` (its volume named as `create` names it)."""
    return [f"remove container {name}", f"remove volume {name}-submission"]
