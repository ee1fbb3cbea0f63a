"""App factory: configuration, database session per request, authentication, error pages."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from apiflask import APIFlask
from apiflask.exceptions import HTTPError
from flask import (
    Response,
    current_app,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_wtf.csrf import CSRFError, CSRFProtect
from sqlalchemy.exc import DataError, StatementError
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from app import security
from app.access import wants_json
from app.api import ERROR_SCHEMA, install_openapi
from app.formatting import byte_size, duration, words
from baseline.config import Settings
from baseline.context import Context
from baseline.errors import DomainError, InvalidInput, NotFound
from baseline.people import accounts, logins
from infra.blobs import BlobNotFound

BLUEPRINTS = (
    "app.blueprints.auth",
    "app.blueprints.studies",
    "app.blueprints.attempts",
    "app.blueprints.tasks",
    "app.blueprints.grading",
    "app.blueprints.analysis",
    "app.blueprints.admin",
    "app.blueprints.hosts",
    "app.blueprints.hub",
    "app.blueprints.participant",
    "app.blueprints.monitor",
    "app.api",
)

csrf = CSRFProtect()
# app.config key: the live demo's `DemoNotice` (its clock, backend), shown on every page.
DEMO_NOTICE = "BASELINE_DEMO_NOTICE"


def _hub_origins(settings: Settings) -> tuple[str, ...]:
    """The hub's origin, where "Open workspace" and logging out lead (none if misconfigured:
    the hub routes then answer with the configuration error themselves)."""
    from baseline.config import ConfigError
    from baseline.hub_settings import hub_config

    try:
        url = urlsplit(hub_config(settings).public_url)
    except ConfigError:
        return ()
    return (f"{url.scheme}://{url.netloc}",) if url.scheme and url.netloc else ()


class DatabaseIdConverter(IntegerConverter):
    """`<int:...>` in every route: ids beyond a 64-bit integer are simply not found (404).

    They are matched and looked up as id 0, which no row has: refusing the match instead makes
    werkzeug answer 405 on a path that has several methods (GET and POST /studies/<id>/tasks).
    """

    NOT_AN_ID = 0

    def to_python(self, value: str) -> int:
        number = int(super().to_python(value))
        return number if number <= 2**63 - 1 else self.NOT_AN_ID


def get_context() -> Context:
    """The domain context of the running app (settings, engine, sessions)."""
    context: Context = current_app.extensions["baseline"]
    return context


def _format_number(value: float | int | None) -> str:
    """Numbers as people write them: 2 not 2.0, 0.25 not 0.250000, 0 not -0 (a score an older
    Baseline stored as -0.0, a lower-is-better task's start)."""
    return "" if value is None else f"{value + 0.0:g}"


def create_app(settings: Settings | None = None, context: Context | None = None) -> APIFlask:
    ctx = context or Context.from_settings(settings)
    app = APIFlask(
        __name__,
        title="Baseline API",
        version="1.0",
        spec_path="/api/v1/openapi.json",
        docs_path="/api/v1/docs",
    )
    app.config.update(
        SECRET_KEY=ctx.settings.secret_key,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=ctx.settings.session_cookie_secure,
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        WTF_CSRF_TIME_LIMIT=None,
        MAX_CONTENT_LENGTH=64 * 1024 * 1024,
        VALIDATION_ERROR_STATUS_CODE=422,
        AUTO_404_RESPONSE=True,
        LOCAL_SPEC_JSON_INDENT=0,
        INFO={"description": "Baseline REST API: studies, tasks, participants and attempts."},
        SECURITY_SCHEMES={"bearer": {"type": "http", "scheme": "bearer"}},
        HTTP_ERROR_SCHEMA=ERROR_SCHEMA,
        VALIDATION_ERROR_SCHEMA=ERROR_SCHEMA,
    )
    app.extensions["baseline"] = ctx
    app.jinja_env.filters["num"] = _format_number
    app.jinja_env.filters["duration"] = duration
    app.jinja_env.filters["bytes"] = byte_size
    app.jinja_env.filters["words"] = words
    app.jinja_env.globals["came_from"] = came_from
    app.url_map.converters["int"] = DatabaseIdConverter
    csrf.init_app(app)

    @app.before_request
    def load_user() -> None:
        g.db = ctx.sessions()
        g.user = None
        header = request.headers.get("Authorization", "")
        if request.path.startswith("/api/"):
            if header.lower().startswith("bearer "):
                g.user = accounts.user_for_token(g.db, header[7:].strip())
                g.db.commit()
            return
        sid = session.get("sid")
        if isinstance(sid, str):
            g.user = logins.user_for_session(g.db, sid)

    @app.teardown_request
    def close_session(_exc: BaseException | None) -> None:
        db = g.pop("db", None)
        if db is not None:
            db.rollback()
            db.close()

    @app.context_processor
    def inject_user() -> dict[str, Any]:
        return {"current_user": g.get("user"), "demo_notice": app.config.get(DEMO_NOTICE)}

    _register_errors(app)
    security.install(app, docs_path="/api/v1/docs", form_targets=_hub_origins(ctx.settings))
    for module_name in BLUEPRINTS:
        module = importlib.import_module(module_name)
        app.register_blueprint(module.bp)
        csrf_exempt = getattr(module, "CSRF_EXEMPT", False)
        if csrf_exempt:
            csrf.exempt(module.bp)
    install_openapi(app)
    return app


def _json_error(status: int, code: str, message: str) -> Response:
    response = jsonify({"error": code, "message": message})
    response.status_code = status
    return response


def came_from() -> str | None:
    """The portal page a refused request came from (the page of the form posted), as a path to
    go back to; None for another site's page, or for the request's own page.

    A refusal says what to do ("reload, and extend again"); the way back to the form is the page
    it was on, which "Back to your studies" was not."""
    referrer = request.referrer
    if not referrer:
        return None
    parts = urlsplit(referrer)
    if parts.netloc != request.host or not parts.path.startswith("/"):
        return None
    if request.method == "GET" and parts.path == request.path:
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _register_errors(app: APIFlask) -> None:
    @app.error_processor
    def api_error(error: HTTPError) -> Response:
        code = {
            401: "unauthorized",
            403: "forbidden",
            404: "not_found",
            412: "precondition_failed",
            422: "invalid_input",
        }
        message = error.message or ""
        if error.detail:
            message = f"{message}: {error.detail}"
        response = _json_error(error.status_code, code.get(error.status_code, "error"), message)
        response.headers.extend(error.headers or {})
        return response

    @app.errorhandler(DomainError)
    def domain_error(error: DomainError) -> Any:
        g.db.rollback()
        if wants_json():
            return _json_error(error.status_code, error.code, error.message)
        return render_template("error.html", status=error.status_code, message=error.message), (
            error.status_code
        )

    @app.errorhandler(OverflowError)
    @app.errorhandler(DataError)
    def out_of_range(error: Exception) -> Any:
        """A number in the URL too large for the database (e.g. ?study=99999999999999999999)."""
        return domain_error(InvalidInput("A number in the request is out of range."))

    @app.errorhandler(StatementError)
    def statement_error(error: StatementError) -> Any:
        if isinstance(error.orig, OverflowError):
            return out_of_range(error)
        return unexpected(error)

    @app.errorhandler(BlobNotFound)
    def missing_blob(error: BlobNotFound) -> Any:
        """Stored content a row points to is gone: say so, do not crash."""
        app.logger.warning("blob missing from the snapshot store: %s", error)
        return domain_error(
            NotFound(f"This content is not in the snapshot store (blob {error} is missing).")
        )

    @app.errorhandler(CSRFError)
    def csrf_error(error: CSRFError) -> Any:
        message = (
            "The form was rejected: its security token is missing or expired. Reload the page."
        )
        if wants_json():
            return _json_error(400, "csrf", message)
        return render_template("error.html", status=400, message=message), 400

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Any:
        status = error.code or 500
        if wants_json():
            return _json_error(
                status, (error.name or "error").lower().replace(" ", "_"), error.description or ""
            )
        if status == 401:
            return redirect(url_for("auth.login", next=request.full_path))
        return render_template("error.html", status=status, message=error.description), status

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Any:
        app.logger.exception("unhandled error")
        message = "An unexpected error happened; it has been logged."
        if wants_json():
            return _json_error(500, "internal", message)
        return render_template("error.html", status=500, message=message), 500
