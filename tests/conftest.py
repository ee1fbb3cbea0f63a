"""Shared fixtures: a migrated database per test, the portal, and logged-in clients per role.

Set BASELINE_TEST_POSTGRES_URL (an admin URL such as postgresql+psycopg://postgres@127.0.0.1/postgres)
to run the database-backed tests on PostgreSQL as well; `.ci/run` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher, profiles
from flask.testing import FlaskClient
from sqlalchemy import create_engine, text
from werkzeug.test import TestResponse

from baseline import migrate
from baseline.config import Settings
from baseline.context import Context
from baseline.models import Role, User
from baseline.people import accounts

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
PASSWORD = "correct horse battery"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or a skip naming what is missing."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared PaperBench data is not beside this checkout")
    return path


def _database_params() -> list[str]:
    params = ["sqlite"]
    if os.environ.get("BASELINE_TEST_POSTGRES_URL"):
        params.append("postgresql")
    return params


@pytest.fixture(autouse=True)
def cheap_password_hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Argon2 at the portal's cost takes about a second per hash or check on the CI machine, and
    the tests make thousands (six accounts per `users`, a check per login): they hash with
    argon2's cheapest parameters. A hash carries its parameters, so checking is cheap too. Tests
    of the hashing itself are marked `real_password_hashing`; processes the tests start (the
    portal, the CLI) always hash at the real cost."""
    if request.node.get_closest_marker("real_password_hashing") is None:
        monkeypatch.setattr(accounts, "_hasher", PasswordHasher.from_parameters(profiles.CHEAPEST))


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to the head revision once per run: each test's SQLite database
    is a copy of this file, which is what running the migrations gives, without running them
    (the migrations are tested from an empty database in tests/baseline/test_models.py)."""
    path = tmp_path_factory.mktemp("template") / "migrated.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def migrated_postgres() -> Iterator[str]:
    """The name of a PostgreSQL database migrated to the head revision once per run: each
    test's PostgreSQL database is made from it as a template (about 0.06 s, against 0.6 s for
    creating and migrating one; 216 tests run on PostgreSQL)."""
    with _postgres_database() as url:
        migrate.upgrade(url)
        yield url.rsplit("/", 1)[1]


@contextlib.contextmanager
def _postgres_database(template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database, empty or a copy of `template`, dropped afterwards."""
    admin_url = os.environ["BASELINE_TEST_POSTGRES_URL"]
    name = f"bl_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    copy = f' TEMPLATE "{template}"' if template else ""
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=_database_params())
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    with _postgres_database() as url:
        yield url


@dataclass(frozen=True)
class SeededStudy:
    """A test module's synthetic study (`analysis.seed.seed_synthetic_study` with this name and
    seed, rows only), seeded once per run into a template database: each test that uses the
    module's seeding fixture (`fixture`) starts on a copy of it, and that fixture finds the study
    there (seeding is idempotent by name). Seeding took about a second per test, three on a
    loaded CI machine, in the hundred analysis and portal tests that seed; a copy takes a few
    milliseconds. A module names its study in `SEEDED_STUDY`."""

    name: str
    seed: int
    fixture: str


class SeededTemplates:
    """The template databases of the run's `SeededStudy`s, made on first use, dropped at the
    end of the run (PostgreSQL) or with the run's temporary folder (SQLite)."""

    def __init__(self, folder: Path, migrated_sqlite: Path, stack: contextlib.ExitStack) -> None:
        self._folder = folder
        self._migrated_sqlite = migrated_sqlite
        self._stack = stack
        self._made: dict[tuple[str, SeededStudy], str] = {}

    def template(self, backend: str, study: SeededStudy, migrated_postgres: str | None) -> str:
        """The SQLite file's path, or the PostgreSQL database's name, holding `study`."""
        key = (backend, study)
        if key not in self._made:
            if backend == "sqlite":
                path = self._folder / f"seeded-{len(self._made)}.db"
                shutil.copyfile(self._migrated_sqlite, path)
                url, made = f"sqlite:///{path}", str(path)
            else:
                url = self._stack.enter_context(_postgres_database(template=migrated_postgres))
                made = url.rsplit("/", 1)[1]
            self._seed(url, study)
            self._made[key] = made
        return self._made[key]

    def _seed(self, url: str, study: SeededStudy) -> None:
        from analysis.seed import seed_synthetic_study

        context = Context.from_settings(
            Settings(home=self._folder, database_url=url, secret_key="seeding")
        )
        with context.session() as session:
            seed_synthetic_study(session, name=study.name, seed=study.seed)
        # A PostgreSQL template is copied only while nothing is connected to it.
        context.engine.dispose()


@pytest.fixture(scope="session")
def seeded_templates(
    tmp_path_factory: pytest.TempPathFactory, migrated_sqlite: Path
) -> Iterator[SeededTemplates]:
    with contextlib.ExitStack() as stack:
        yield SeededTemplates(tmp_path_factory.mktemp("seeded"), migrated_sqlite, stack)


def _seeded_template(request: pytest.FixtureRequest, backend: str) -> str | None:
    """The template holding the module's seeded study, when this test uses the fixture that
    seeds it (a SQLite file's path, or a PostgreSQL database's name); else None."""
    study = getattr(request.module, "SEEDED_STUDY", None)
    if not isinstance(study, SeededStudy) or study.fixture not in request.fixturenames:
        return None
    templates: SeededTemplates = request.getfixturevalue("seeded_templates")
    migrated = request.getfixturevalue("migrated_postgres") if backend == "postgresql" else None
    return templates.template(backend, study, migrated)


@pytest.fixture(params=_database_params())
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_sqlite: Path
) -> Iterator[str]:
    """A fresh database at the head revision: a SQLite file, or a new PostgreSQL database
    dropped afterwards; holding the module's seeded study when the test seeds it (SeededStudy)."""
    seeded = _seeded_template(request, request.param)
    if request.param == "sqlite":
        path = tmp_path / "test.db"
        shutil.copyfile(seeded or migrated_sqlite, path)
        yield f"sqlite:///{path}"
        return
    template = seeded or request.getfixturevalue("migrated_postgres")
    with _postgres_database(template=template) as url:
        yield url


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    return Settings(home=home, database_url=database_url, secret_key="test-secret")


@pytest.fixture
def ctx(settings: Settings) -> Iterator[Context]:
    # A no-op on the migrated copies; it migrates the empty SQLite files some modules make.
    migrate.upgrade(settings.database_url)
    context = Context.from_settings(settings)
    yield context
    context.engine.dispose()


@dataclass
class Users:
    by_role: dict[Role, User]

    def __getitem__(self, role: Role) -> User:
        return self.by_role[role]


@pytest.fixture
def users(ctx: Context) -> Users:
    """One account per role (plus a second participant), all with PASSWORD."""
    created: dict[Role, User] = {}
    with ctx.session() as session:
        for role in Role:
            created[role] = accounts.create_user(
                session, f"{role.value}@test.example", role.value.title(), PASSWORD, role
            )
    return Users(created)


@pytest.fixture
def app(ctx: Context):  # type: ignore[no-untyped-def]
    from app import create_app

    application = create_app(context=ctx)
    application.config.update(TESTING=True)
    return application


@pytest.fixture
def client(app) -> FlaskClient:  # type: ignore[no-untyped-def]
    return app.test_client()


def json_of(response: TestResponse) -> Any:
    """A JSON answer's body (the test fails, naming the answer, when it is not JSON)."""
    body = response.json
    assert body is not None, response.get_data(as_text=True)[:300]
    return body


def login(client: FlaskClient, email: str, password: str = PASSWORD) -> None:
    """Log in through the real form, CSRF token included."""
    import re

    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token, "login form has no CSRF token"
    response = client.post(
        "/login", data={"email": email, "password": password, "csrf_token": token.group(1)}
    )
    assert response.status_code == 302, response.get_data(as_text=True)


# Modules that cannot share the machine with the whole parallel run: pytest-xdist's workers leave
# them out unless they are named on the command line, and scripts/test.sh runs them after the
# parallel run has ended, QUIET_MODULES two at a time, then ALONE_MODULES one by one.
QUIET_MODULES = (
    # the live demo on its time-scaled clock (a working hour every 4 s): its agents must get
    # their steps done between checkpoints, which 4 workers' containers and processes on 2
    # cores did not leave them time for (floor scores, checkpoints not scored within 420 s)
    "tests/baseline/demo/test_live_demo.py",
)
ALONE_MODULES = (
    # kills and restarts dockerd, which every Docker test shares (another worker's
    # module-scoped container would die with it)
    "tests/baseline/test_dockerd_crash.py",
    # holds each checkpoint to half a wall second at 1,200 working seconds per wall second,
    # which a machine busy with other tests' work cannot promise
    "tests/baseline/attempts/test_attempt_timeline.py",
)


def _named(config: pytest.Config) -> set[Path]:
    """The files named on the command line (a node id's file, a directory stays a directory)."""
    here = config.invocation_params.dir
    return {(here / arg.split("::", 1)[0]).resolve() for arg in config.args}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under pytest-xdist (a worker, or the controller of `-n N`), the quiet and alone modules are
    left out of a run that does not name them."""
    parallel = hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))
    if not parallel:
        return None
    path = collection_path.resolve()
    try:
        module = path.relative_to(REPO).as_posix()
    except ValueError:  # not under this checkout
        return None
    if module in QUIET_MODULES + ALONE_MODULES and path not in _named(config):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Workspaces the tests make in this process run as a deployment of this test process (not
    the `default` a real portal uses): scripts/leak-check.sh fails on any it finds left behind.

    Each pytest-xdist worker is a deployment of its own, not the one its controller named (the
    workers inherit the controller's environment): a reconcile in one worker removes the
    deployment's containers it does not know, which would be another worker's live workspaces.
    """
    from tests.docker_env import DEPLOYMENT_PREFIX, RUN_ID

    own = f"{DEPLOYMENT_PREFIX}run-{RUN_ID}"
    inherited = os.environ.get("BASELINE_DEPLOYMENT", "")
    if not inherited or (
        os.environ.get("PYTEST_XDIST_WORKER") and inherited.startswith(f"{DEPLOYMENT_PREFIX}run-")
    ):
        os.environ["BASELINE_DEPLOYMENT"] = own


LONG_TESTS = REPO / "tests" / "long_tests.txt"


def _long_tests() -> dict[str, float]:
    """tests/long_tests.txt: the seconds each long test took in a measured run, by node id."""
    if not LONG_TESTS.exists():
        return {}
    found: dict[str, float] = {}
    for line in LONG_TESTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, node_id = line.split(maxsplit=1)
            found[node_id] = float(seconds)
    return found


DATABASE_FIXTURES = ("database_url", "empty_database_url")


# A test marked with one of these runs on that database only: its instance on the other is
# deselected (`_needless`).
ONLY_MARKERS = {"sqlite_only": "sqlite", "postgresql_only": "postgresql"}


def _needless(item: pytest.Item) -> bool:
    """A `sqlite_only` test's PostgreSQL instance: the test checks the system (containers, hosts,
    agents, browsers), not the storage, whose PostgreSQL paths the storage and portal tests run.
    A `postgresql_only` test's SQLite instance: another test runs the same on SQLite."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    backends = {callspec.params.get(name) for name in DATABASE_FIXTURES} - {None}
    return any(
        item.get_closest_marker(marker) is not None and not backends <= {only}
        for marker, only in ONLY_MARKERS.items()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`sqlite_only` tests' PostgreSQL instances and `postgresql_only` tests' SQLite ones are
    deselected (pytest reports how many); then,
    under pytest-xdist, each worker starts with its share of the long tests.

    worksteal hands each worker a run of consecutive tests, and idle workers later steal the
    tail of a busy worker's run: a long test at the end of the collection (the top-level
    end-to-end modules sort last) would start last and keep one worker busy minutes after the
    others ran dry. So the long tests (tests/long_tests.txt) are dealt to the runs, longest first,
    each to the run with the least long work so far, and placed at the runs' heads; the other
    tests fill the runs in their collection order. Every worker computes the same order (the
    same items, the same worker count), as xdist requires.
    """
    needless = [item for item in items if _needless(item)]
    if needless:
        config.hook.pytest_deselected(items=needless)
        items[:] = [item for item in items if not _needless(item)]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or len(items) < workers:
        return
    durations = _long_tests()
    long = sorted(
        (item for item in items if item.nodeid in durations),
        key=lambda item: -durations[item.nodeid],
    )
    if not long:
        return
    taken = {id(item) for item in long}
    rest = iter([item for item in items if id(item) not in taken])
    # worksteal's first distribution: worker k gets the next len(pending) // (workers - k)
    sizes: list[int] = []
    remaining = len(items)
    for k in range(workers):
        sizes.append(remaining // (workers - k))
        remaining -= sizes[-1]
    runs: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in long:
        open_runs = [k for k in range(workers) if len(runs[k]) < sizes[k]]
        k = min(open_runs, key=lambda run: loads[run])
        runs[k].append(item)
        loads[k] += durations[item.nodeid]
    for k in range(workers):
        while len(runs[k]) < sizes[k]:
            runs[k].append(next(rest))
    items[:] = [item for run in runs for item in run]
