"""Incremental capture of a submission volume on an ssh:// host through a helper container:
a volume whose container is gone, hostile files judged as locally, only changed content moved,
unchanged files not even read again."""

from __future__ import annotations

import contextlib
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker.errors import NotFound
from docker.models.containers import Container

from infra.blobs import BlobStore
from infra.docker_backend import HELPER_LABEL, DockerBackend
from infra.remote_capture import capture_volume, helper_name
from infra.snapshots import verify
from tests.docker_env import TEST_LABELS, TEST_RUN_LABEL, docker_url, new_name, test_image

pytestmark = [pytest.mark.docker, pytest.mark.sshd]
__all__ = ["test_image"]

FILL = r"""
set -e
cd /s
mkdir -p src/deep __pycache__
printf 'alpha' > a.txt
printf 'beta' > src/deep/b.txt
printf 'secret' > locked.txt && chmod 000 locked.txt
printf 'cache' > __pycache__/x.pyc
ln -s /etc/passwd escape
mkfifo pipe
printf 'odd' > "$(printf 'odd-\377')"
chown -R 1000:1000 /s
"""


@pytest.fixture
def ssh_backend() -> Iterator[DockerBackend]:
    backend = DockerBackend.from_url(docker_url("ssh"), labels=TEST_LABELS)
    yield backend
    backend.close()


def _in_volume(backend: DockerBackend, image: str, volume: str, script: str) -> None:
    """Run a shell script as root on the volume in a container that is removed right after."""
    backend.client.containers.run(
        image,
        ["sh", "-c", script],
        entrypoint=[],
        user="0",
        remove=True,
        network_mode="none",
        volumes={volume: {"bind": "/s", "mode": "rw"}},
        labels=TEST_LABELS,
    )


@pytest.fixture
def volume(ssh_backend: DockerBackend, test_image: str) -> Iterator[str]:
    name = new_name("bl-vol")
    ssh_backend.client.volumes.create(name, labels=TEST_LABELS)
    yield name
    ssh_backend.remove_helpers(name)  # a volume cannot be removed while its helper mounts it
    ssh_backend.client.volumes.get(name).remove(force=True)


def test_containerless_volume_captured_over_ssh_then_only_changes_move(
    ssh_backend: DockerBackend, volume: str, test_image: str, tmp_path: Path
) -> None:
    _in_volume(ssh_backend, test_image, volume, FILL)  # its container is gone afterwards
    store = BlobStore(tmp_path / "blobs")
    # A staging budget of 5 bytes: some content is staged by the scan, the rest is packed.
    first = capture_volume(ssh_backend, test_image, volume, store, stage_bytes=5)
    entries = {e.key: e for e in first.manifest.entries}
    assert entries[b"a.txt"].sha256 == hashlib.sha256(b"alpha").hexdigest()
    assert entries[b"src/deep/b.txt"].sha256 == hashlib.sha256(b"beta").hexdigest()
    assert entries[b"locked.txt"].sha256 == hashlib.sha256(b"secret").hexdigest()
    assert entries[b"locked.txt"].mode == 0
    assert entries[b"escape"].type == "symlink" and entries[b"escape"].target == "/etc/passwd"
    odd = entries[b"odd-\xff"]
    assert odd.raw_name is not None and store.open(odd.sha256 or "").read() == b"odd"
    skipped = {(s.path, s.reason) for s in first.manifest.skipped}
    assert ("pipe", "special_file") in skipped and ("__pycache__", "ignored") in skipped
    assert first.reused_hashes == 0 and first.file_count == 4
    assert verify(store, first.manifest_sha256) == []

    _in_volume(ssh_backend, test_image, volume, "printf 'alpha, changed' > /s/a.txt")
    helpers = [c.id for c in _helpers(ssh_backend, volume)]
    assert len(helpers) == 1
    second = capture_volume(ssh_backend, test_image, volume, store, previous=first.manifest_sha256)
    assert second.reused_hashes == 3
    kept = {e.key: e for e in second.manifest.entries}
    assert kept[b"locked.txt"] == entries[b"locked.txt"]  # not read: same stat key as before
    # the changed file, the manifest part listing it and the new manifest, nothing else
    assert second.new_blobs == 3
    changed = {e.key: e for e in second.manifest.entries}[b"a.txt"]
    assert changed.sha256 == hashlib.sha256(b"alpha, changed").hexdigest()
    assert not changed.changed_while_read
    assert verify(store, second.manifest_sha256) == []
    # One long-lived helper per volume, reused by the next capture (no container life cycle).
    assert [c.id for c in _helpers(ssh_backend, volume)] == helpers


def _helpers(backend: DockerBackend, volume: str) -> list[Container]:
    return backend.client.containers.list(all=True, filters={"label": [f"{HELPER_LABEL}={volume}"]})


def test_a_capture_replaces_a_helper_that_is_gone_and_removing_the_volume_removes_it(
    ssh_backend: DockerBackend, test_image: str, tmp_path: Path
) -> None:
    name = new_name("bl-vol")
    ssh_backend.client.volumes.create(name, labels=TEST_LABELS)
    try:
        _in_volume(ssh_backend, test_image, name, "printf 'one' > /s/one.txt")
        store = BlobStore(tmp_path / "blobs")
        first = capture_volume(ssh_backend, test_image, name, store)
        (helper,) = _helpers(ssh_backend, name)
        assert helper.name == helper_name(name) and helper.status == "running"
        assert helper.labels[TEST_RUN_LABEL] == TEST_LABELS[TEST_RUN_LABEL]  # reconcile's scope
        helper.kill()  # a helper that died (host reboot, idle end): the next capture makes one
        second = capture_volume(
            ssh_backend, test_image, name, store, previous=first.manifest_sha256
        )
        assert second.reused_hashes == 1 and second.new_blobs == 1  # only the manifest's head
        assert second.manifest.parts == first.manifest.parts  # entries kept byte for byte
        (again,) = _helpers(ssh_backend, name)
        assert again.id != helper.id
        # Removing the volume the backend's way removes its helper first (else "volume in use").
        ssh_backend._remove_volume(name)
        assert _helpers(ssh_backend, name) == []
    finally:
        ssh_backend.remove_helpers(name)
        with contextlib.suppress(NotFound):
            ssh_backend.client.volumes.get(name).remove(force=True)


def test_requests_to_new_urls_reuse_the_open_ssh_connection(ssh_backend: DockerBackend) -> None:
    """`infra.docker_backend._tune_ssh`: a request to a URL not seen before (as every exec's
    start is) takes the idle connection instead of opening an SSH channel and starting a
    `docker system dial-stdio` on the host, and requests leave without Nagle's wait."""
    api = ssh_backend.api
    transport = api.get_adapter(api.base_url).ssh_client.get_transport()
    assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    api.version()  # one connection open, and idle once answered
    opened = transport._channel_counter  # paramiko's count of the channels it opened
    for _ in range(5):
        with pytest.raises(NotFound):
            api.inspect_container(new_name("bl-absent"))  # a new URL each time
    assert transport._channel_counter == opened
