"""GPU inventory parsing (recorded nvidia-smi outputs), device choice and Docker device requests.

No GPU exists on the test machines: the inventory tests feed recorded nvidia-smi text through a
runner that returns it, exactly as the host's command channel would.
"""

from __future__ import annotations

from collections.abc import Sequence

import docker.types
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.gpus import (
    NVIDIA_SMI_QUERY,
    CommandResult,
    GpuDevice,
    InventoryError,
    NvidiaSmiMissing,
    UnsatisfiableRequest,
    choose_devices,
    declared_inventory,
    device_ids,
    device_request,
    device_request_body,
    local_runner,
    model_matches,
    parse_nvidia_smi,
    query_inventory,
)

# Recorded from `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`.
H100_X8 = """\
0, GPU-5d6a1e2b-37a1-4c3f-9d1e-1f6b7d0e2a10, NVIDIA H100 80GB HBM3, 81559
1, GPU-8e1f0c3d-2b4a-4e5f-8a6b-7c8d9e0f1a21, NVIDIA H100 80GB HBM3, 81559
2, GPU-1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c32, NVIDIA H100 80GB HBM3, 81559
3, GPU-2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d43, NVIDIA H100 80GB HBM3, 81559
4, GPU-3c4d5e6f-7a8b-4c9d-0e1f-2a3b4c5d6e54, NVIDIA H100 80GB HBM3, 81559
5, GPU-4d5e6f7a-8b9c-4d0e-1f2a-3b4c5d6e7f65, NVIDIA H100 80GB HBM3, 81559
6, GPU-5e6f7a8b-9c0d-4e1f-2a3b-4c5d6e7f8a76, NVIDIA H100 80GB HBM3, 81559
7, GPU-6f7a8b9c-0d1e-4f2a-3b4c-5d6e7f8a9b87, NVIDIA H100 80GB HBM3, 81559
"""
A10_TIGHT_SPACING = "0,GPU-aaaa,NVIDIA A10,23028\n1,GPU-bbbb,NVIDIA A10,23028\r\n\n"
MIXED_NA = "0, [N/A], NVIDIA A100-SXM4-80GB, [N/A]\n1, GPU-cccc, NVIDIA A10, 23028\n"
NO_DEVICES = "No devices were found\n"
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def recorded(exit_code: int, stdout: str = "", stderr: str = ""):  # type: ignore[no-untyped-def]
    """A host command channel that answers nvidia-smi with a recorded result."""
    calls: list[Sequence[str]] = []

    def runner(argv: Sequence[str]) -> CommandResult:
        calls.append(tuple(argv))
        return CommandResult(exit_code, stdout, stderr)

    runner.calls = calls  # type: ignore[attr-defined]
    return runner


def test_parses_eight_h100s_in_index_order() -> None:
    runner = recorded(0, H100_X8)
    devices = query_inventory(runner)
    assert runner.calls == [NVIDIA_SMI_QUERY]
    assert [d.index for d in devices] == list(range(8))
    assert {d.model for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert devices[0].uuid == "GPU-5d6a1e2b-37a1-4c3f-9d1e-1f6b7d0e2a10"
    assert devices[7].memory_mib == 81559


def test_tight_spacing_crlf_and_blank_lines() -> None:
    devices = parse_nvidia_smi(A10_TIGHT_SPACING)
    assert [(d.index, d.uuid, d.model, d.memory_mib) for d in devices] == [
        (0, "GPU-aaaa", "NVIDIA A10", 23028),
        (1, "GPU-bbbb", "NVIDIA A10", 23028),
    ]


def test_not_available_fields_become_none() -> None:
    devices = parse_nvidia_smi(MIXED_NA)
    assert devices[0].uuid is None and devices[0].memory_mib is None
    assert devices[0].model == "NVIDIA A100-SXM4-80GB"


def test_name_with_comma_is_kept_whole() -> None:
    (device,) = parse_nvidia_smi("0, GPU-x, Weird, Name GPU, 1024\n")
    assert device.model == "Weird, Name GPU" and device.memory_mib == 1024


def test_no_devices_is_an_empty_inventory() -> None:
    assert query_inventory(recorded(0, NO_DEVICES)) == []
    assert query_inventory(recorded(6, NO_DEVICES)) == []


def test_driver_failure_is_an_error_not_an_empty_inventory() -> None:
    with pytest.raises(InventoryError, match="exited 9"):
        query_inventory(recorded(9, DRIVER_FAILURE))


def test_missing_nvidia_smi_is_told_apart() -> None:
    with pytest.raises(NvidiaSmiMissing):
        query_inventory(recorded(127, "", "sh: nvidia-smi: not found"))


def test_local_runner_reports_a_missing_command_as_127() -> None:
    result = local_runner(["baseline-no-such-command-xyz"])
    assert result.exit_code == 127
    assert local_runner(["sh", "-c", "echo hi; exit 3"]) == CommandResult(3, "hi\n", "")


@pytest.mark.parametrize(
    "text",
    [
        "0, GPU-a, NVIDIA A10\n",  # three fields
        "x, GPU-a, NVIDIA A10, 100\n",  # index not a number
        "0, GPU-a, NVIDIA A10, lots\n",  # memory not a number
        "0, GPU-a, [N/A], 100\n",  # no name
        "0, GPU-a, NVIDIA A10, 100\n0, GPU-b, NVIDIA A10, 100\n",  # repeated index
    ],
)
def test_malformed_output_is_refused(text: str) -> None:
    with pytest.raises(InventoryError):
        parse_nvidia_smi(text)


def test_declared_inventory_by_count_and_explicit() -> None:
    devices = declared_inventory(
        [{"model": "NVIDIA A10", "count": 2}, {"index": 5, "model": "NVIDIA H100"}]
    )
    assert [(d.index, d.model) for d in devices] == [
        (0, "NVIDIA A10"),
        (1, "NVIDIA A10"),
        (5, "NVIDIA H100"),
    ]
    with pytest.raises(InventoryError, match="repeat"):
        declared_inventory([{"model": "A10", "count": 1}, {"index": 0, "model": "A10"}])
    with pytest.raises(InventoryError, match="not valid"):
        declared_inventory([{"count": 1}])


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("h100 80gb", "NVIDIA H100 80GB HBM3", True),
        ("NVIDIA A10", "NVIDIA A10", True),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("A100", "NVIDIA A10", False),
        ("H100", "NVIDIA H200", False),
        ("", "NVIDIA A10", False),
    ],
)
def test_model_matching_uses_whole_tokens(requested: str, device: str, expected: bool) -> None:
    assert model_matches(requested, device) is expected


def test_mismatched_model_is_refused_not_substituted() -> None:
    inventory = parse_nvidia_smi(MIXED_NA)  # one A100, one A10
    assert [d.index for d in choose_devices(inventory, set(), "A10", 1) or []] == [1]
    with pytest.raises(UnsatisfiableRequest, match="2 x A10"):
        choose_devices(inventory, set(), "A10", 2)
    with pytest.raises(UnsatisfiableRequest):
        choose_devices(inventory, set(), "H100", 1)
    with pytest.raises(UnsatisfiableRequest):
        choose_devices(inventory, set(), None, 1)
    assert choose_devices(inventory, set(), None, 0) == []


MODELS = ["NVIDIA A10", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]
inventories = st.lists(st.sampled_from(MODELS), max_size=12).map(
    lambda models: [GpuDevice(index=i, model=m) for i, m in enumerate(models)]
)


@given(
    inventory=inventories,
    busy=st.sets(st.integers(0, 12)),
    model=st.sampled_from(["A10", "H100", "A100"]),
    count=st.integers(0, 6),
)
def test_choice_is_free_matching_lowest_and_deterministic(
    inventory: list[GpuDevice], busy: set[int], model: str, count: int
) -> None:
    matching = [d for d in inventory if model_matches(model, d.model)]
    if count > len(matching):
        with pytest.raises(UnsatisfiableRequest):
            choose_devices(inventory, busy, model, count)
        return
    chosen = choose_devices(inventory, busy, model, count)
    free = [d for d in matching if d.index not in busy]
    if len(free) < count:
        assert chosen is None
        return
    assert chosen is not None
    assert len(chosen) == count
    assert all(d.index not in busy and model_matches(model, d.model) for d in chosen)
    assert chosen == free[:count]  # the lowest free indexes
    assert choose_devices(list(reversed(inventory)), busy, model, count) == chosen


@given(ids=st.lists(st.integers(0, 15).map(str), unique=True, max_size=8))
def test_device_request_is_what_the_docker_api_expects(ids: list[str]) -> None:
    sdk = device_request(ids)
    reference = docker.types.DeviceRequest(
        driver="nvidia", device_ids=list(ids), capabilities=[["gpu"]]
    )
    assert dict(sdk) == dict(reference)
    assert dict(sdk) == device_request_body(ids)
    # The SDK's HostConfig accepts the raw body and serialises it unchanged for the Engine API.
    host_config = docker.types.HostConfig(
        version="1.41", device_requests=[device_request_body(ids)]
    )
    assert host_config["DeviceRequests"] == [device_request_body(ids)]
    assert host_config["DeviceRequests"][0]["DeviceIDs"] == ids


def test_device_ids_are_sorted_indexes() -> None:
    devices = [GpuDevice(index=3, model="A10"), GpuDevice(index=1, model="A10")]
    assert device_ids(devices) == ["1", "3"]
