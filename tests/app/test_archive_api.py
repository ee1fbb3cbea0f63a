"""GET /api/v1/studies/ID/archive: the same checked archive the command line writes, staff only."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from flask import Flask

from analysis.archive import load_archive
from baseline.archive.reader import open_archive
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.models import Role
from baseline.people import accounts
from tests.analysis import archive_world
from tests.analysis.archive_world import NOTE
from tests.conftest import Users, json_of


def _token(app: Flask, users: Users, role: Role) -> dict[str, str]:
    with app.extensions["baseline"].session() as session:
        token = accounts.issue_token(session, session.merge(users[role]), "archive")
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.sqlite_only("the route's access and file are the subject; export is tested elsewhere")
def test_coordinators_download_a_checked_archive(
    app: Flask, ctx: Context, users: Users, tmp_path: Path
) -> None:
    with ctx.session() as session:
        world = archive_world.build(session, store_for(ctx), tmp_path / "work")
    client = app.test_client()
    url = f"/api/v1/studies/{world.study_id}/archive"
    response = client.get(url + "?include_notes=true", headers=_token(app, users, Role.COORDINATOR))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.headers["Content-Disposition"].endswith(f"study-{world.study_id}-archive.tar")
    saved = tmp_path / "downloaded.tar"
    saved.write_bytes(response.get_data())
    with open_archive(saved) as archive:
        pauses = pq.read_table(io.BytesIO(archive.read("tables/pauses.parquet"))).to_pylist()
    assert NOTE in [p["note"] for p in pauses]
    assert load_archive(saved).study_id == world.study_id

    refused = client.get(url, headers=_token(app, users, Role.ANALYST))
    assert refused.status_code == 403
    missing = client.get("/api/v1/studies/999999/archive", headers=_token(app, users, Role.ADMIN))
    assert missing.status_code == 404 and json_of(missing)["error"] == "not_found"
