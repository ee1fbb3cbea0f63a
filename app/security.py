"""Security headers on every response, Swagger UI served from the installed package, a favicon.

The Content-Security-Policy allows scripts from this origin only: no inline script and no
third-party host anywhere in the portal (templates keep their JavaScript in app/static). The one
other origin is the hub's: forms lead there, and the work page frames its JupyterLab. Inline
styles stay allowed because plotly.js injects its own stylesheet. The one page with inline script,
Apiflask's Swagger UI page, gets the hashes of exactly the scripts it rendered, so nothing injected
into it could run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from flask import Blueprint, Flask, Response, current_app, request, send_from_directory

from app.access import PUBLIC, requires

POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self' 'unsafe-inline'",
    "img-src": "'self' data:",
    "font-src": "'self' data:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)

bp = Blueprint("security", __name__)


def swagger_ui_dir() -> Path:
    """The Swagger UI 5 distribution shipped by the `swagger-ui-py` package (5 reads the
    OpenAPI 3.1 document Apiflask writes)."""
    import swagger_ui

    return Path(swagger_ui.__file__).parent / "static"


def _policy(extra_scripts: list[str]) -> str:
    policy = dict(POLICY)
    # Forms may lead on to these origins (Chromium applies form-action to redirects too): the
    # hub, which "Open workspace" and logging out redirect to.
    targets = current_app.config.get("BASELINE_FORM_TARGETS") or []
    if targets:
        policy["form-action"] += " " + " ".join(targets)
        # The hub is also the one origin a page may frame: the work page's JupyterLab.
        policy["frame-src"] = " ".join(targets)
    if extra_scripts:
        policy["script-src"] += " " + " ".join(f"'sha256-{h}'" for h in extra_scripts)
    return "; ".join(f"{name} {value}" for name, value in policy.items())


def _script_hashes(html: str) -> list[str]:
    return [
        base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        for body in _INLINE_SCRIPT.findall(html)
    ]


def add_headers(response: Response) -> Response:
    hashes: list[str] = []
    docs_path = current_app.config.get("BASELINE_DOCS_PATH")
    if request.path == docs_path and response.mimetype == "text/html":
        hashes = _script_hashes(response.get_data(as_text=True))
    response.headers.setdefault("Content-Security-Policy", _policy(hashes))
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


@bp.route("/favicon.ico")
@requires(PUBLIC)
def favicon() -> Response:
    static = current_app.static_folder
    assert static is not None
    response = send_from_directory(static, "favicon.ico", mimetype="image/vnd.microsoft.icon")
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response


def install(app: Flask, docs_path: str, form_targets: tuple[str, ...] = ()) -> None:
    """Headers on every response; Swagger UI's assets from this origin. `form_targets` are the
    other origins a form's redirect may lead to."""
    assets = Blueprint(
        "swagger_ui",
        __name__,
        static_folder=str(swagger_ui_dir()),
        static_url_path="/static/swagger-ui",
    )
    app.register_blueprint(assets)
    app.register_blueprint(bp)
    app.config.update(
        BASELINE_DOCS_PATH=docs_path,
        BASELINE_FORM_TARGETS=list(form_targets),
        SWAGGER_UI_CSS="/static/swagger-ui/swagger-ui.css",
        SWAGGER_UI_BUNDLE_JS="/static/swagger-ui/swagger-ui-bundle.js",
        SWAGGER_UI_STANDALONE_PRESET_JS="/static/swagger-ui/swagger-ui-standalone-preset.js",
        DOCS_FAVICON="/favicon.ico",
    )
    app.after_request(add_headers)
