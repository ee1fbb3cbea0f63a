"""Settings: embedded defaults, environment over file, clear errors for unusable values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from baseline.config import ConfigError, load_settings
from baseline.db import make_engine


def test_defaults_live_under_home(tmp_path: Path) -> None:
    settings = load_settings({"BASELINE_HOME": str(tmp_path)})
    assert settings.database_url == f"sqlite:///{tmp_path / 'baseline.db'}"
    assert len(settings.secret_key) == 64
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert load_settings({"BASELINE_HOME": str(tmp_path)}).secret_key == settings.secret_key


def test_environment_wins_over_file(tmp_path: Path) -> None:
    config = tmp_path / "baseline.toml"
    config.write_text('secret_key = "from-file"\ninvitation_ttl_hours = 5\nflavour = "x"\n')
    env = {"BASELINE_HOME": str(tmp_path), "BASELINE_CONFIG": str(config)}
    settings = load_settings(env)
    assert settings.secret_key == "from-file" and settings.invitation_ttl_hours == 5
    assert settings.extra == {"flavour": "x"}
    env["BASELINE_SECRET_KEY"] = "from-env"
    assert load_settings(env).secret_key == "from-env"


@pytest.mark.parametrize(
    ("content", "message"),
    [("not = = toml", "is not valid"), ("[1, 2]", "is not valid")],
)
def test_bad_config_file(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_settings({"BASELINE_HOME": str(tmp_path), "BASELINE_CONFIG": str(config)})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings({"BASELINE_HOME": str(tmp_path), "BASELINE_CONFIG": str(tmp_path / "no")})


def test_bad_number(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="BASELINE_INVITATION_TTL_HOURS: not a positive number"):
        load_settings({"BASELINE_HOME": str(tmp_path), "BASELINE_INVITATION_TTL_HOURS": "soon"})


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'sub' / 'x.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()


def test_capture_bounds_have_defaults_and_must_be_positive(tmp_path: Path) -> None:
    env = {"BASELINE_HOME": str(tmp_path)}
    defaults = load_settings(env)
    assert (defaults.snapshot_max_file_mb, defaults.snapshot_max_new_mb) == (10.0, 4096.0)
    assert load_settings({**env, "BASELINE_SNAPSHOT_MAX_NEW_MB": "1.5"}).snapshot_max_new_mb == 1.5
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ConfigError, match="BASELINE_SNAPSHOT_MAX_FILE_MB: not a positive"):
            load_settings({**env, "BASELINE_SNAPSHOT_MAX_FILE_MB": bad})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("notaurl", "not a database URL"),
        ("mysql://u:hunter2@db/x", "mysql is not supported: Baseline runs on SQLite or PostgreSQL"),
        ("oracle+nodriver://u:hunter2@db/x", "unknown database 'oracle+nodriver'"),
        ("postgresql+asyncpg://u:hunter2@db/x", "driver of 'postgresql+asyncpg' is not installed"),
    ],
)
def test_an_unusable_database_url_is_a_config_error_that_keeps_its_password(
    tmp_path: Path, url: str, message: str
) -> None:
    """Each of these ended the first command in a traceback (SQLAlchemy's, at create_engine)."""
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        load_settings({"BASELINE_HOME": str(tmp_path), "BASELINE_DATABASE_URL": url})
    assert str(raised.value).startswith("BASELINE_DATABASE_URL: ")
    assert "hunter2" not in str(raised.value)


def test_both_supported_databases_pass_the_check(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path / 'x.db'}", "postgresql+psycopg://u:pw@127.0.0.1:1/x"):
        env = {"BASELINE_HOME": str(tmp_path), "BASELINE_DATABASE_URL": url}
        assert load_settings(env).database_url == url


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        # a negative time-to-live made every invitation expired on arrival
        ("BASELINE_INVITATION_TTL_HOURS", "-3", "not a positive number: '-3'"),
        # anything but true read as false: cookies sent over plain HTTP behind a typo
        ("BASELINE_SESSION_COOKIE_SECURE", "ture", "not yes or no: 'ture'"),
    ],
)
def test_a_setting_read_wrongly_before_is_refused(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{name}: {message}")):
        load_settings({"BASELINE_HOME": str(tmp_path), name: value})


def test_secure_cookies_take_the_usual_yes_and_no_words(tmp_path: Path) -> None:
    for value, secure in (("TRUE", True), ("yes", True), ("1", True), ("off", False), ("", False)):
        env = {"BASELINE_HOME": str(tmp_path), "BASELINE_SESSION_COOKIE_SECURE": value}
        assert load_settings(env).session_cookie_secure is secure


def test_a_home_that_cannot_be_made_names_the_setting(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="BASELINE_HOME: cannot write"):
        load_settings({"BASELINE_HOME": str(blocker / "home")})
