"""Make a workspace use the egress proxy: its CA trusted, its URL in the environment.

The proxy decrypts HTTPS to match paths, so the workspace must trust the proxy's CA. The files go
under /etc (`put_archive` of the workspace backend, as root); the environment names them, so that
curl, git, pip, requests and Python's ssl module all verify against the combined bundle (the
image's own CAs plus the proxy's). `environment` is merged into `WorkspaceSpec.env` before the
workspace is created; `install` runs after it exists.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping

from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle

EGRESS_DIR = "/etc/baseline-egress"
PROXY_CA = f"{EGRESS_DIR}/proxy-ca.pem"
CA_BUNDLE = f"{EGRESS_DIR}/ca-bundle.pem"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
NO_PROXY = "localhost,127.0.0.1,::1"


def environment(proxy_url: str) -> dict[str, str]:
    """The variables that send a workspace's HTTP(S) through the proxy and trust its CA."""
    env = {
        "HTTP_PROXY": proxy_url,
        "HTTPS_PROXY": proxy_url,
        "NO_PROXY": NO_PROXY,
        "REQUESTS_CA_BUNDLE": CA_BUNDLE,
        "SSL_CERT_FILE": CA_BUNDLE,
        "CURL_CA_BUNDLE": CA_BUNDLE,
        "PIP_CERT": CA_BUNDLE,
        "GIT_SSL_CAINFO": CA_BUNDLE,
        "NODE_EXTRA_CA_CERTS": PROXY_CA,
    }
    env.update({key.lower(): value for key, value in env.items() if key.endswith("_PROXY")})
    return env


def pip_conf() -> str:
    return f"[global]\ncert = {CA_BUNDLE}\n"


def archive(proxy_ca_pem: bytes, system_bundle: bytes = b"") -> bytes:
    """A tar, to extract at /, holding the proxy CA, the combined bundle and pip's config."""
    if b"BEGIN CERTIFICATE" not in proxy_ca_pem:
        raise ValueError("the proxy CA is not a PEM certificate")
    bundle = system_bundle.rstrip(b"\n") + b"\n" + proxy_ca_pem if system_bundle else proxy_ca_pem
    files: Mapping[str, bytes] = {
        PROXY_CA: proxy_ca_pem,
        CA_BUNDLE: bundle,
        "/etc/pip.conf": pip_conf().encode(),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        directory = tarfile.TarInfo(EGRESS_DIR.lstrip("/"))
        directory.type, directory.mode, directory.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        tar.addfile(directory)
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def read_file(backend: WorkspaceBackend, handle: WorkspaceHandle, path: str) -> bytes | None:
    """One file of the workspace through `get_archive`; None when it is not there."""
    try:
        data = backend.get_archive(handle, path)
    except (FileNotFoundError, WorkspaceError):
        return None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                return extracted.read() if extracted else None
            if member.issym() or member.islnk():
                return read_file(backend, handle, _resolve(path, member.linkname))
    return None


def _resolve(path: str, link: str) -> str:
    return link if link.startswith("/") else f"{path.rsplit('/', 1)[0]}/{link}"


def install(backend: WorkspaceBackend, handle: WorkspaceHandle, proxy_ca_pem: bytes) -> None:
    """Put the proxy CA, the combined bundle (image CAs + proxy CA) and pip.conf in place."""
    system = read_file(backend, handle, SYSTEM_BUNDLE) or b""
    backend.put_archive(handle, "/", archive(proxy_ca_pem, system))
