"""What every /api/v1 resource module shares: the blueprint, the error schema, auth helpers.

Authentication is by per-user bearer token only (no session cookie), so the API needs no CSRF
protection. Every error is JSON `{"error": ..., "message": ...}` with a 4xx code, and every
response is declared in the OpenAPI document at /api/v1/openapi.json (schemathesis checks it).

Decorator order on every route: the route, then @requires, then input/output/doc. The role check
must run before input validation, or a refused caller would learn the input schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from apiflask import APIBlueprint
from flask import Response, current_app, g

from app.access import current_user
from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import User
from infra.blobs import BlobNotFound

bp = APIBlueprint("api", __name__, url_prefix="/api/v1")

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
BEARER: list[str | dict[str, list[Any]]] = [{"bearer": []}]
AUTH_ERRORS = [401, 403]


def user() -> User:
    """The authenticated caller (guaranteed by @requires on every non-public route)."""
    caller = current_user()
    assert caller is not None
    return caller


def commit() -> None:
    g.db.commit()


@contextmanager
def blobs_present(what: str) -> Iterator[None]:
    """A stored blob that is missing is a 409 with a message, never a 500."""
    try:
        yield
    except BlobNotFound as exc:
        raise Conflict(f"{what}: a stored file is missing ({exc})") from exc


def send_bytes(data: bytes, mimetype: str, filename: str) -> Response:
    """A download: the bytes as an attachment with the given file name."""
    return Response(
        data,
        mimetype=mimetype,
        headers={"Content-Disposition": f"attachment; filename={filename}"},
    )


def context() -> Context:
    """The domain context of the running app (app.factory imports this package, so not from it)."""
    ctx: Context = current_app.extensions["baseline"]
    return ctx
