"""GPU inventory of a host and the pure choice of devices for a workspace.

The inventory comes from `nvidia-smi` run over the host's command channel (a local subprocess, or
paramiko for a remote host), or from the host's configuration where nvidia-smi is absent. The
choice of devices is a pure function so that its properties (never a busy device, never the wrong
model, always the same answer for the same input) can be tested without a GPU; the database layer
makes the choice exclusive. The Docker request for the chosen devices is built here too, in the
two forms the SDK and the raw Engine API take.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import docker.types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

NVIDIA_SMI_QUERY: tuple[str, ...] = (
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
)
_NOT_AVAILABLE = {"[n/a]", "n/a", "[not supported]", ""}
_NO_DEVICES = "no devices were found"
_COMMAND_MISSING_EXIT = 127


class GpuDevice(BaseModel):
    """One GPU as stored in `Host.gpus`."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0)
    uuid: str | None = None
    model: str = Field(min_length=1)
    memory_mib: int | None = Field(default=None, ge=0)


class InventoryError(Exception):
    """nvidia-smi ran but failed, or printed something that is not an inventory."""


class NvidiaSmiMissing(InventoryError):
    """The host has no nvidia-smi: its inventory must be declared in its configuration."""


class UnsatisfiableRequest(ValueError):
    """The host can never serve this request: too few GPUs of the profile's model, in total."""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


CommandRunner = Callable[[Sequence[str]], CommandResult]
"""Runs argv on a host and returns its result; a missing command gives exit code 127."""


def local_runner(argv: Sequence[str], timeout_s: float = 30.0) -> CommandResult:
    """Run a command on this machine; a missing executable reads as exit 127, like a shell."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as exc:
        return CommandResult(_COMMAND_MISSING_EXIT, "", str(exc))
    return CommandResult(done.returncode, done.stdout, done.stderr)


def _optional(value: str) -> str | None:
    return None if value.strip().lower() in _NOT_AVAILABLE else value.strip()


def parse_nvidia_smi(output: str) -> list[GpuDevice]:
    """Parse `index, uuid, name, memory.total` CSV lines; the name may itself hold commas."""
    devices: list[GpuDevice] = []
    for number, raw in enumerate(output.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.lower().startswith(_NO_DEVICES):
            return []
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 4:
            raise InventoryError(f"nvidia-smi line {number} has {len(fields)} fields: {line!r}")
        index_text, uuid_text, memory_text = fields[0], fields[1], fields[-1]
        name = ", ".join(fields[2:-1]).strip()
        if not index_text.isdigit():
            raise InventoryError(f"nvidia-smi line {number}: index {index_text!r} is not a number")
        memory = _optional(memory_text)
        if memory is not None and not memory.isdigit():
            raise InventoryError(f"nvidia-smi line {number}: memory {memory_text!r} is not MiB")
        if _optional(name) is None:
            raise InventoryError(f"nvidia-smi line {number}: GPU {index_text} has no name")
        devices.append(
            GpuDevice(
                index=int(index_text),
                uuid=_optional(uuid_text),
                model=name,
                memory_mib=int(memory) if memory is not None else None,
            )
        )
    indexes = [device.index for device in devices]
    if len(set(indexes)) != len(indexes):
        raise InventoryError(f"nvidia-smi listed a GPU index twice: {indexes}")
    return sorted(devices, key=lambda device: device.index)


def query_inventory(runner: CommandRunner) -> list[GpuDevice]:
    """Ask the host's nvidia-smi; raises NvidiaSmiMissing or InventoryError, never guesses."""
    result = runner(NVIDIA_SMI_QUERY)
    combined = f"{result.stdout}\n{result.stderr}".strip()
    if result.exit_code == _COMMAND_MISSING_EXIT:
        raise NvidiaSmiMissing(f"nvidia-smi is not installed on the host: {combined[:200]}")
    if result.exit_code != 0:
        if _NO_DEVICES in combined.lower():
            return []
        raise InventoryError(f"nvidia-smi exited {result.exit_code}: {combined[:500]}")
    return parse_nvidia_smi(result.stdout)


def declared_inventory(declared: Iterable[Mapping[str, Any]]) -> list[GpuDevice]:
    """A host's GPUs written in its configuration: explicit devices, or {"model", "count"}.

    `[{"model": "NVIDIA A10", "count": 2}]` declares indexes 0 and 1; explicit entries
    (`{"index": 3, "model": ...}`) keep their index. Indexes must not repeat.
    """
    devices: list[GpuDevice] = []
    next_index = 0
    for entry in declared:
        try:
            if "count" in entry:
                count = int(entry["count"])
                if count < 0:
                    raise InventoryError(f"declared GPU count {count} is negative")
                for _ in range(count):
                    devices.append(GpuDevice(index=next_index, model=str(entry["model"])))
                    next_index += 1
            else:
                device = GpuDevice.model_validate(dict(entry))
                devices.append(device)
                next_index = max(next_index, device.index + 1)
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise InventoryError(f"declared GPU {dict(entry)!r} is not valid: {exc}") from exc
    indexes = [device.index for device in devices]
    if len(set(indexes)) != len(indexes):
        raise InventoryError(f"declared GPUs repeat an index: {sorted(indexes)}")
    return sorted(devices, key=lambda device: device.index)


def _tokens(name: str) -> list[str]:
    return [token for token in re.split(r"[\s\-_/]+", name.lower()) if token]


def model_matches(requested: str, device_model: str) -> bool:
    """Whether a profile's GPU model names this device: whole tokens, in order, case-blind.

    "H100" matches "NVIDIA H100 80GB HBM3"; "A10" does not match "NVIDIA A100-SXM4-80GB".
    """
    wanted, have = _tokens(requested), _tokens(device_model)
    if not wanted:
        return False
    return any(have[i : i + len(wanted)] == wanted for i in range(len(have) - len(wanted) + 1))


def choose_devices(
    inventory: Sequence[GpuDevice], busy: Collection[int], model: str | None, count: int
) -> list[GpuDevice] | None:
    """The `count` free devices of `model` with the lowest indexes, or None if too few are free.

    Raises UnsatisfiableRequest when the host has fewer than `count` GPUs of that model in all,
    so a request is never served by another model and never waits forever on the wrong host.
    """
    if count < 0:
        raise ValueError(f"GPU count {count} is negative")
    if count == 0:
        return []
    if model is None or not model.strip():
        raise UnsatisfiableRequest(f"{count} GPU(s) requested without a GPU model")
    matching = sorted(
        (device for device in inventory if model_matches(model, device.model)),
        key=lambda device: device.index,
    )
    if len(matching) < count:
        have = ", ".join(sorted({device.model for device in inventory})) or "no GPUs"
        raise UnsatisfiableRequest(
            f"{count} x {model} requested; the host has {len(matching)} ({have})"
        )
    free = [device for device in matching if device.index not in busy]
    if len(free) < count:
        return None
    return free[:count]


def device_ids(devices: Iterable[GpuDevice]) -> list[str]:
    """Docker/NVIDIA device ids: the nvidia-smi indexes, as strings, in ascending order."""
    return [str(device.index) for device in sorted(devices, key=lambda device: device.index)]


def device_request(ids: Sequence[str]) -> docker.types.DeviceRequest:
    """The SDK's request for exactly these GPUs (`device_requests=[...]` of containers.create)."""
    return docker.types.DeviceRequest(driver="nvidia", device_ids=list(ids), capabilities=[["gpu"]])


def device_request_body(ids: Sequence[str]) -> dict[str, Any]:
    """The same request as the Engine API's HostConfig.DeviceRequests entry expects it."""
    return {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": list(ids),
        "Capabilities": [["gpu"]],
        "Options": {},
    }
