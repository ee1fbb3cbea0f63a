"""Settings read once from the environment and an optional TOML/JSON file.

Everything has an embedded default so that `baseline serve` works on a fresh machine with no
configuration: the data lives under ``$BASELINE_HOME`` (default ``./instance``) in a SQLite file.
"""

from __future__ import annotations

import json
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

# What Baseline runs on (its migrations and locks are written for these two).
SUPPORTED_DATABASES = ("sqlite", "postgresql")
YES, NO = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
DATABASE_URL_EXAMPLE = "sqlite:///path/to/baseline.db or postgresql+psycopg://user@host/db"


class ConfigError(ValueError):
    """A setting is present but unusable; the message names the setting."""


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    secret_key: str
    session_cookie_secure: bool = False
    invitation_ttl_hours: float = 72.0
    # What one capture (snapshot, executed reproduction) may take: files past the first are
    # skipped `too_large`; new content past the second `over_budget` (the portal's disk).
    snapshot_max_file_mb: float = 10.0
    snapshot_max_new_mb: float = 4096.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def blob_dir(self) -> Path:
        return self.home / "blobs"

    @property
    def task_dir(self) -> Path:
        return self.home / "tasks"


def _secret_key(home: Path) -> str:
    """Persist a random secret key so that sessions survive restarts without configuration."""
    path = home / "secret_key"
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


def _read_file(path: Path) -> dict[str, object]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"BASELINE_CONFIG: cannot read {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"BASELINE_CONFIG: {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"BASELINE_CONFIG: {path} must hold a table of settings")
    return data


def yes_or_no(setting: str, raw: str) -> bool:
    """A yes/no setting's value (true/false, yes/no, 1/0, on/off, any case); anything else is
    refused by name: a typo must not read as "no"."""
    word = raw.strip().lower()
    if word not in YES | NO:
        raise ConfigError(f"{setting}: not yes or no: {raw!r}")
    return word in YES


def _database_url(raw: str) -> str:
    """`raw`, checked where it is read: a URL SQLAlchemy cannot parse, another database, or a
    driver that is not installed ended the first command in a traceback. The value itself is not
    repeated in the message: it may hold a password."""
    try:
        url = make_url(raw)
        dialect = url.get_dialect()
    except NoSuchModuleError as exc:  # an ArgumentError too: first
        raise ConfigError(
            f"BASELINE_DATABASE_URL: unknown database {url.drivername!r}: Baseline runs on "
            f"SQLite or PostgreSQL (for example {DATABASE_URL_EXAMPLE})"
        ) from exc
    except ArgumentError as exc:
        raise ConfigError(
            f"BASELINE_DATABASE_URL: not a database URL (for example {DATABASE_URL_EXAMPLE})"
        ) from exc
    if url.get_backend_name() not in SUPPORTED_DATABASES:
        raise ConfigError(
            f"BASELINE_DATABASE_URL: {url.get_backend_name()} is not supported: Baseline runs "
            f"on SQLite or PostgreSQL (for example {DATABASE_URL_EXAMPLE})"
        )
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise ConfigError(
            f"BASELINE_DATABASE_URL: the driver of {url.drivername!r} is not installed "
            f"({exc}); PostgreSQL's is postgresql+psycopg://"
        ) from exc
    return raw


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Environment variables win over the BASELINE_CONFIG file, which wins over defaults."""
    env = dict(os.environ if environ is None else environ)
    file_values: dict[str, object] = {}
    if env.get("BASELINE_CONFIG"):
        file_values = _read_file(Path(env["BASELINE_CONFIG"]))

    def pick(name: str, default: str | None = None) -> str | None:
        env_name = f"BASELINE_{name.upper()}"
        if env_name in env:
            return env[env_name]
        value = file_values.get(name)
        return default if value is None else str(value)

    home = Path(pick("home", "instance") or "instance").expanduser().resolve()
    database_url = _database_url(pick("database_url") or f"sqlite:///{home / 'baseline.db'}")
    try:
        secret_key = pick("secret_key") or _secret_key(home)
    except OSError as exc:
        raise ConfigError(f"BASELINE_HOME: cannot write {home}: {exc.strerror}") from exc
    secure = yes_or_no(
        "BASELINE_SESSION_COOKIE_SECURE", pick("session_cookie_secure", "false") or "false"
    )

    def positive(name: str, default: float) -> float:
        raw = pick(name, str(default))
        try:
            value = float(raw or default)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ConfigError(f"BASELINE_{name.upper()}: not a positive number: {raw!r}")
        return value

    ttl = positive("invitation_ttl_hours", 72.0)
    max_file_mb = positive("snapshot_max_file_mb", 10.0)
    max_new_mb = positive("snapshot_max_new_mb", 4096.0)
    known = {
        "home",
        "database_url",
        "secret_key",
        "invitation_ttl_hours",
        "session_cookie_secure",
        "snapshot_max_file_mb",
        "snapshot_max_new_mb",
    }
    extra = {k: v for k, v in file_values.items() if k not in known}
    return Settings(
        home=home,
        database_url=database_url,
        secret_key=secret_key,
        session_cookie_secure=secure,
        invitation_ttl_hours=ttl,
        snapshot_max_file_mb=max_file_mb,
        snapshot_max_new_mb=max_new_mb,
        extra=extra,
    )
