"""Egress control end to end: a workspace's requests go through the real mitmproxy with our addon,
to HTTP and HTTPS servers on this machine; the blacklisted ones are refused and every one is logged
and ingested into the database.

Workspaces: the local sandbox backend (bubblewrap, shared network) and, with a Docker Engine, a
container on an internal bridge network whose only reachable address is the proxy's.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import io
import ipaddress
import json
import os
import socket
import ssl
import tarfile
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from baseline.context import Context
from baseline.models import Workspace, WorkspacePurpose
from baseline.workspaces import egress as egress_domain
from infra.egress import proxy as proxy_module
from infra.egress import setup
from infra.egress.proxy import EgressProxy, EgressProxyError, find_mitmdump
from infra.egress.rules import (
    BlacklistRule,
    Decision,
    WorkspacePolicy,
    is_private_destination,
    parse_blacklist,
)
from infra.workspace import HardwareProfile, WorkspaceBackend, WorkspaceHandle, WorkspaceSpec
from tests.conftest import shared_path
from tests.infra.test_local_backend import sandbox_backend, unavailable

# -- rules -----------------------------------------------------------------------------------


def test_parses_the_real_paperbench_blacklists() -> None:
    papers = shared_path("paperbench", "papers")
    rules = [
        rule
        for path in sorted(papers.glob("*/blacklist.txt"))
        for rule in parse_blacklist(path.read_text())
    ]
    assert len(rules) >= 20
    assert all(rule.host == "github.com" and rule.path_prefix.count("/") == 2 for rule in rules)


def test_blacklist_file_format() -> None:
    assert parse_blacklist("none\n") == []
    assert parse_blacklist("# only a comment\n\n") == []
    (rule,) = parse_blacklist("https://github.com/ROIM1998/APT  # the authors' code\n")
    assert (rule.host, rule.path_prefix) == ("github.com", "/roim1998/apt")


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://github.com/ROIM1998/APT", True),
        ("https://github.com/ROIM1998/APT/blob/main/train.py", True),
        ("https://www.github.com/roim1998/apt/", True),
        ("https://github.com/ROIM1998/APT.git/info/refs?service=git-upload-pack", True),
        ("https://github.com/ROIM1998/%41PT", True),
        ("https://github.com/ROIM1998/x/../APT", True),
        ("http://github.com:80/ROIM1998/APT", True),
        ("https://github.com/ROIM1998/APTX", False),
        ("https://github.com/ROIM1998", False),
        ("https://gist.github.com/ROIM1998/APT", False),
        ("https://pypi.org/simple/torch/", False),
    ],
)
def test_blacklist_matches_host_and_path_prefix(url: str, refused: bool) -> None:
    policy = WorkspacePolicy(
        mode="blacklist",
        token="t",
        blacklist=(BlacklistRule.parse("https://github.com/ROIM1998/APT"),),
    )
    decision = policy.decide(url)
    assert decision.allowed is not refused
    assert decision.rule == ("https://github.com/ROIM1998/APT" if refused else None)


GITHUB_REPO = "https://github.com/ROIM1998/APT"


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://codeload.github.com/ROIM1998/APT/zip/refs/heads/main", True),
        ("https://codeload.github.com/roim1998/apt/tar.gz/refs/heads/main", True),
        ("https://codeload.github.com/ROIM1998/APT/legacy.zip/refs/heads/main", True),
        ("https://api.github.com/repos/ROIM1998/APT", True),
        ("https://api.github.com/repos/roim1998/APT/zipball/main", True),
        ("https://api.github.com/repos/ROIM1998/apt/tarball", True),
        ("https://api.github.com/repos/ROIM1998/APT/contents/train.py?ref=main", True),
        ("https://raw.githubusercontent.com/ROIM1998/APT/main/train.py", True),
        ("https://raw.githubusercontent.com/roim1998/apt/refs/heads/main/README.md", True),
        ("https://raw.github.com/ROIM1998/APT/main/train.py", True),
        ("https://media.githubusercontent.com/media/ROIM1998/APT/main/weights.bin", True),
        ("https://codeload.github.com/ROIM1998/APT-other/zip/refs/heads/main", False),
        ("https://codeload.github.com/ROIM1998/APTX/tar.gz/refs/heads/main", False),
        ("https://api.github.com/repos/ROIM1998/APT-other/zipball", False),
        ("https://api.github.com/repos/ROIM1998/aptitude", False),
        ("https://api.github.com/users/ROIM1998", False),
        ("https://raw.githubusercontent.com/ROIM1998/APTitude/main/x.py", False),
        ("https://raw.githubusercontent.com/someone/APT/main/x.py", False),
        ("https://gist.githubusercontent.com/ROIM1998/APT/raw/x.py", False),
    ],
)
def test_a_github_repository_is_refused_on_every_host_that_serves_it(
    url: str, refused: bool
) -> None:
    """Its archive (codeload, the API's zipball and tarball) and raw files are its content as
    much as github.com/OWNER/REPO is; other repositories of the owner stay reachable."""
    policy = WorkspacePolicy(
        mode="blacklist", token="t", blacklist=(BlacklistRule.parse(GITHUB_REPO),)
    )
    assert policy.decide(url) == Decision(not refused, GITHUB_REPO if refused else None)


def test_github_content_hosts_follow_owner_and_repository_entries_only() -> None:
    """An owner entry covers the owner's repositories there; other hosts' entries, and entries
    deeper than a repository, keep to their own host."""
    (owner,) = parse_blacklist("github.com/ROIM1998\n")
    assert owner.matches("codeload.github.com", "/roim1998/anything/zip/refs/heads/main")
    assert owner.matches("api.github.com", "/repos/ROIM1998/anything/tarball")
    assert not owner.matches("api.github.com", "/repos/ROIM1998x/anything/tarball")
    (gitlab,) = parse_blacklist("https://gitlab.com/ROIM1998/APT\n")
    assert not gitlab.matches("codeload.github.com", "/ROIM1998/APT/zip/refs/heads/main")
    (whole,) = parse_blacklist("https://github.com\n")
    assert whole.places == (("github.com", "/"),)
    (deep,) = parse_blacklist(f"{GITHUB_REPO}/blob/main/train.py\n")
    assert deep.places == (("github.com", "/roim1998/apt/blob/main/train.py"),)


def test_raw_tunnels_to_github_content_hosts_are_refused_with_the_repository() -> None:
    policy = WorkspacePolicy(
        mode="blacklist", token="t", blacklist=(BlacklistRule.parse(GITHUB_REPO),)
    )
    hosts = ("github.com", "codeload.github.com", "API.github.com", "raw.githubusercontent.com")
    for host in hosts:
        assert policy.blocks_host(host), host
    assert not policy.blocks_host("pypi.org")
    assert not WorkspacePolicy(mode="open", token="t").blocks_host("codeload.github.com")


def test_modes() -> None:
    assert WorkspacePolicy(mode="open", token="t").decide("https://x.org/a").allowed
    assert not WorkspacePolicy(mode="none", token="t").decide("https://x.org/a").allowed
    with pytest.raises(ValueError, match="not one of"):
        WorkspacePolicy(mode="closed", token="t")


@pytest.mark.parametrize(
    ("host", "private"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("10.1.2.3", True),
        ("172.18.0.1", True),
        ("169.254.169.254", True),
        ("[::1]", True),
        ("github.com", False),
        ("140.82.112.3", False),
    ],
)
def test_private_destinations(host: str, private: bool) -> None:
    assert is_private_destination(host) is private


def test_setup_files_and_environment() -> None:
    env = setup.environment("http://ws:tok@10.0.0.1:8080")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://ws:tok@10.0.0.1:8080"
    assert env["REQUESTS_CA_BUNDLE"] == env["SSL_CERT_FILE"] == env["PIP_CERT"] == setup.CA_BUNDLE
    pem = b"-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n"
    with tarfile.open(fileobj=io.BytesIO(setup.archive(pem, b"system-cas\n"))) as tar:
        bundle = tar.extractfile(setup.CA_BUNDLE.lstrip("/"))
        pip = tar.extractfile("etc/pip.conf")
        assert bundle is not None and bundle.read() == b"system-cas\n" + pem
        assert pip is not None and setup.CA_BUNDLE.encode() in pip.read()
    with pytest.raises(ValueError, match="PEM"):
        setup.archive(b"not a cert")


# -- servers on this machine -----------------------------------------------------------------


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        body = f"served {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class Servers:
    def __init__(self, directory: Path) -> None:
        self.seen: list[str] = []
        handler = type("Handler", (Recorder,), {"seen": self.seen})
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.https = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.cert, key = self_signed(directory)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.https.socket = context.wrap_socket(self.https.socket, server_side=True)
        self.threads = [
            threading.Thread(target=server.serve_forever, daemon=True)
            for server in (self.http, self.https)
        ]
        for thread in self.threads:
            thread.start()

    def url(self, scheme: str, path: str) -> str:
        server = self.http if scheme == "http" else self.https
        return f"{scheme}://127.0.0.1:{server.server_address[1]}{path}"

    def close(self) -> None:
        for server in (self.http, self.https):
            server.shutdown()
            server.server_close()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    instance = Servers(tmp_path)
    yield instance
    instance.close()


def proxy_or_unavailable(
    state: Path, listen_host: str, upstream_ca: Path, *, allow_private: bool = True
) -> EgressProxy:
    """The real proxy; the test servers are on 127.0.0.1, so private addresses are allowed."""
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    proxy = EgressProxy(
        state, listen_host=listen_host, upstream_ca=upstream_ca, allow_private=allow_private
    )
    proxy.start()
    return proxy


def test_a_drawn_port_taken_before_mitmdump_binds_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the draw and mitmdump's bind another socket can take the port (an outgoing
    connection did, for a test server, in a CI run): the proxy then draws another one."""
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    with socket.socket() as holder:  # bound, not listening: nothing answers there
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        draws = [taken]
        real_draw = proxy_module.draw_port
        monkeypatch.setattr(
            proxy_module, "draw_port", lambda host: draws.pop() if draws else real_draw(host)
        )
        proxy = EgressProxy(tmp_path / "proxy")
        proxy.start()
        try:
            assert not draws, "the taken port was never drawn"
            assert proxy.port != taken
            assert proxy_module.PORTS[0] <= proxy.port < proxy_module.PORTS[1]
            assert proxy.answers()
            log = (tmp_path / "proxy/mitmdump.log").read_text().lower()
            assert "address already in use" in log  # the first try really failed on the port
        finally:
            proxy.stop()


def test_a_kept_port_that_is_taken_is_a_clear_error(tmp_path: Path) -> None:
    """A kept port is where workspaces were told to go: it is not silently changed."""
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        proxy = EgressProxy(tmp_path / "proxy", port=taken)
        with pytest.raises(EgressProxyError, match=f"port 127.0.0.1:{taken} is in use"):
            proxy.start()
        assert proxy.port == taken


# The client inside the workspace: Python's urllib honours HTTP(S)_PROXY, the credentials in it,
# and SSL_CERT_FILE (the combined bundle). It prints "status url" per URL.
CLIENT = """
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            print(response.status, url, response.read().decode())
    except urllib.error.HTTPError as error:
        print(error.code, url, error.read().decode().strip())
    except Exception as error:
        print("error", url, repr(error))
"""


def fetch(backend: WorkspaceBackend, handle: WorkspaceHandle, urls: list[str]) -> dict[str, str]:
    result = backend.exec(handle, ["python3", "-c", CLIENT, *urls], timeout_s=120)
    assert result.exit_code == 0, result.output
    lines = result.output.decode().splitlines()
    statuses = {line.split(" ", 2)[1]: line.split(" ", 1)[0] for line in lines}
    assert len(statuses) == len(urls), lines
    return statuses


@pytest.fixture(params=["local", "docker"])
def workspace_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_blacklisted_urls_are_refused_and_logged(
    workspace_kind: str, ctx: Context, servers: Servers, tmp_path: Path
) -> None:
    name = f"ws-egress-{uuid.uuid4().hex[:8]}"
    blacklist = f"{servers.url('http', '/blocked/repo')}\n{servers.url('https', '/Secret/Repo')}\n"
    cleanup: list[object] = []
    try:
        if workspace_kind == "local":
            backends = sandbox_backend(tmp_path / "local")
            backend: WorkspaceBackend = next(backends)
            cleanup.append(lambda: next(backends, None))
            proxy = proxy_or_unavailable(tmp_path / "egress", "127.0.0.1", servers.cert)
            cleanup.append(proxy.stop)
            image, network, proxy_host = "host", "open", "127.0.0.1"
        else:
            backend, image, network, proxy_host, proxy = docker_workspace(
                tmp_path, servers, cleanup
            )
        credentials = proxy.register(name, "blacklist", blacklist)
        env = setup.environment(credentials.url(proxy_host, proxy.port))
        env.update(NO_PROXY="", no_proxy="")  # the test servers are on 127.0.0.1, via the proxy
        spec = WorkspaceSpec(
            name=name,
            image=image,
            profile=HardwareProfile(name="cpu", cpus=1, memory_mb=512),
            network=network,
            env=env,
        )
        handle = backend.create(spec)
        cleanup.append(lambda: backend.destroy(handle))
        backend.start(handle)
        setup.install(backend, handle, proxy.ca_path.read_bytes())

        allowed = [servers.url("http", "/open/data.csv"), servers.url("https", "/open/model.bin")]
        refused = [
            servers.url("http", "/blocked/repo/file.py"),
            servers.url("https", "/Secret/Repo"),
            servers.url("https", "/secret/repo.git/info/refs"),
        ]
        statuses = fetch(backend, handle, allowed + refused)
        assert {u: statuses[u] for u in allowed} == {u: "200" for u in allowed}, statuses
        assert {u: statuses[u] for u in refused} == {u: "403" for u in refused}, statuses
        # Refused requests never reached the servers; allowed ones did, HTTPS decrypted.
        assert sorted(servers.seen) == ["/open/data.csv", "/open/model.bin"]

        # A workspace without the proxy's credentials is refused too (and logged).
        anonymous = {k: v.replace(f"{name}:{credentials.token}@", "") for k, v in env.items()}
        backend.exec(handle, ["sh", "-c", "true"])  # the workspace still answers
        probe = backend.exec(
            handle,
            [
                "env",
                *(f"{k}={v}" for k, v in anonymous.items()),
                "python3",
                "-c",
                CLIENT,
                allowed[0],
            ],
        )
        assert probe.output.startswith(b"407"), probe.output
    finally:
        for step in reversed(cleanup):
            step()  # type: ignore[operator]

    with ctx.session() as session:
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT,
                backend=workspace_kind,
                name=name,
                image=image,
                hardware_profile="cpu",
            )
        )
    with ctx.session() as session:
        report = egress_domain.ingest(session, proxy.log_path)
    egress_domain.commit_offset(proxy.log_path, report)
    assert report.invalid == []
    with ctx.session() as session:
        events = egress_domain.events_for(session, name)
        logged = {(e.method, e.url, e.allowed, e.rule) for e in events}
        assert all(e.workspace_id is not None for e in events)
        anonymous_events = egress_domain.events_for(session, "")
    for url in allowed:
        assert ("GET", url, True, None) in logged
    assert ("GET", refused[0], False, servers.url("http", "/blocked/repo")) in logged
    assert ("GET", refused[1], False, servers.url("https", "/Secret/Repo")) in logged
    assert ("GET", refused[2], False, servers.url("https", "/Secret/Repo")) in logged
    assert len(events) == 5
    assert [(e.url, e.allowed, e.rule) for e in anonymous_events] == [
        (allowed[0], False, "unauthenticated")
    ]
    with ctx.session() as session:  # a second ingest adds nothing: the offset was kept
        assert egress_domain.ingest(session, proxy.log_path).ingested == 0


def docker_workspace(
    tmp_path: Path, servers: Servers, cleanup: list[object]
) -> tuple[WorkspaceBackend, str, str, str, EgressProxy]:
    """A Docker backend, an internal network and the proxy listening on its gateway."""
    import docker

    from infra.docker_backend import DockerBackend
    from infra.egress.network import ensure_network
    from tests.docker_env import TEST_LABELS, docker_url, new_name, workspace_image

    url = docker_url("unix")
    image = workspace_image()
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    cleanup.append(backend.close)
    client = docker.DockerClient(base_url=url)
    network = new_name("bl-test-egress")
    gateway = ensure_network(client, network, TEST_LABELS)
    cleanup.append(lambda: (client.networks.get(network).remove(), client.close()))
    proxy = proxy_or_unavailable(tmp_path / "egress", gateway, servers.cert)
    cleanup.append(proxy.stop)
    return backend, image, network, gateway, proxy


def test_ingest_reports_bad_lines_and_waits_for_incomplete_ones(
    ctx: Context, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    good = {
        "at": "2026-01-01T00:00:00+00:00",
        "workspace": "w",
        "method": "GET",
        "url": "http://a/",
        "allowed": False,
        "rule": "r",
    }
    log.write_text(json.dumps(good) + "\nnot json\n" + json.dumps(good)[:20])
    with ctx.session() as session:
        report = egress_domain.ingest(session, log)
    assert (report.ingested, report.refused) == (1, 1)
    assert len(report.invalid) == 1 and report.invalid[0].startswith("line 2")
    egress_domain.commit_offset(log, report)
    with log.open("a") as handle:
        handle.write(json.dumps(good)[20:] + "\n")
    with ctx.session() as session:
        again = egress_domain.ingest(session, log)
        assert again.ingested == 1 and again.invalid == []
        assert len(egress_domain.events_for(session, "w")) == 2
    assert os.path.exists(egress_domain.offset_path(log))


def test_the_hosts_own_services_are_refused_by_default(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without allow_private, a workspace cannot reach loopback (the portal, the database)."""
    for variable in ("no_proxy", "NO_PROXY"):  # urllib would bypass the proxy for 127.0.0.1
        monkeypatch.delenv(variable, raising=False)
    proxy = proxy_or_unavailable(
        tmp_path / "egress", "127.0.0.1", servers.cert, allow_private=False
    )
    try:
        credentials = proxy.register("ws-private", "open")
        handler = urllib.request.ProxyHandler(
            {scheme: credentials.url("127.0.0.1", proxy.port) for scheme in ("http", "https")}
        )
        opener = urllib.request.build_opener(handler)
        for url in (servers.url("http", "/x"), f"http://localhost:{servers.http.server_port}/x"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                opener.open(url, timeout=20)
            assert refused.value.code == 403
        with socket.create_connection(("127.0.0.1", proxy.port), 10) as raw:
            token = base64.b64encode(f"ws-private:{credentials.token}".encode()).decode()
            raw.sendall(
                b"CONNECT 127.0.0.1:55432 HTTP/1.1\r\nHost: 127.0.0.1:55432\r\n"
                + f"Proxy-Authorization: Basic {token}\r\n\r\n".encode()
            )
            assert raw.recv(100).startswith(b"HTTP/1.1 403")
    finally:
        proxy.stop()
    assert servers.seen == []
    events = [json.loads(line) for line in proxy.log_path.read_text().splitlines()]
    assert [(e["allowed"], e["rule"]) for e in events] == [(False, "private address")] * 3


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_name_that_resolves_to_loopback_is_refused_and_logged_refused(
    scheme: str, servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`2130706433` is 127.0.0.1 to the resolver but no address to a check by name: the proxy
    refused it only at connect (a 502), after logging the request allowed."""
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    proxy = proxy_or_unavailable(
        tmp_path / "egress", "127.0.0.1", servers.cert, allow_private=False
    )
    try:
        credentials = proxy.register("ws-resolved", "open")
        proxies = {name: credentials.url("127.0.0.1", proxy.port) for name in ("http", "https")}
        trusting = ssl.create_default_context(cafile=str(proxy.ca_path))
        trusting.check_hostname = False  # the proxy's certificate is for the name as asked
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler(proxies), urllib.request.HTTPSHandler(context=trusting)
        )
        server = servers.http if scheme == "http" else servers.https
        url = f"{scheme}://2130706433:{server.server_port}/x"
        with pytest.raises(urllib.error.URLError) as refused:
            opener.open(url, timeout=20)
        assert "403" in str(refused.value)  # HTTP: the response; HTTPS: the CONNECT's
    finally:
        proxy.stop()
    assert servers.seen == []
    events = [json.loads(line) for line in proxy.log_path.read_text().splitlines()]
    method, logged_url = ("GET", url) if scheme == "http" else ("CONNECT", url.split("/")[2])
    assert [
        (e["workspace"], e["method"], e["url"], e["allowed"], e["rule"], e["resolved"])
        for e in events
    ] == [("ws-resolved", method, logged_url, False, "private address", ["127.0.0.1"])]
