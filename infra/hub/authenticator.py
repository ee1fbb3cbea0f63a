"""The hub's authenticator: the portal is the identity provider (JupyterHub's forced-login).

There is no login form: `auto_login` makes ``/hub/login`` call `authenticate` directly, which reads
the one-time ``login_token`` the portal put in the URL and redeems it with the portal. The portal
answers with the hub user name only if the token is fresh, unused and for the participant's own
live attempt; anything else is a 403 from the hub, and the participant goes back to the portal.

The hub login lasts no longer than the portal session that made it. At the login the hub tells
the portal its session id of this browser (JupyterHub's ``jupyterhub-session-id``, which the OAuth
tokens of the single-user servers opened in this browser carry too), and the portal binds it to
the portal session that issued the token. Then `refresh_user` asks the portal about that browser's
login: its portal session expired or revoked without a logout (which ends the hub user outright,
`infra.hub.hub_api.end_user`) ends the hub login in that browser, while the same person's login in
another browser, made from another portal session, stands. The hub's pages, and with
`auth_refresh_strict` the server's token checks too (JupyterLab's requests, after the server's
token cache of 5 minutes), send the person back to the portal. Their server keeps running (a
training job is not killed by an expired cookie); a terminal's websocket opened before stays open
until it closes. A hub login made before logins were bound has no portal session to stand on and
is refused at its first refresh: the participant opens the workspace from the portal again.

JupyterHub keeps its refresh per user (`auth_refresh_age`), so one browser's fresh answer would
cover another's stale login; here it asks at every request (at most once a second per user) and
`refresh_user` keeps each browser's live answer for `session_check_age` (5 minutes) instead.
Nothing is kept in ``auth_state`` (the hub stores none: no crypt key is configured). A portal
that does not answer (or answers 5xx) is not an expired session: the login stands until the next
check asks again.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from jupyterhub.auth import Authenticator
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.login import LogoutHandler
from tornado import web
from traitlets import Integer, Unicode, default

from infra.hub.portal_client import PortalRefused, call


class PortalLogoutHandler(LogoutHandler):
    """The hub's logout, where the portal's ends: clear the hub session, back to the portal."""

    async def render_logout_page(self) -> None:
        self.redirect(self.authenticator.portal_url.rstrip("/") + "/login", permanent=False)


class NoTokenPage(BaseHandler):
    """The hub's Token page, refused: a participant's only way in is the portal's one-time login,
    and a token minted here would outlive the portal session (the ``tokens`` scope is withheld
    too, see `infra.hub.config.PARTICIPANT_SCOPES`, so the API refuses as well)."""

    async def get(self) -> None:
        raise web.HTTPError(403, "API tokens are not available in this study.")


def hub_session_of(handler: web.RequestHandler | None) -> str | None:
    """The hub's session id of the browser behind a request: its ``jupyterhub-session-id``
    cookie, or for a token check the session the OAuth token was issued in. None for a request
    that belongs to no browser (a server's own API token)."""
    if not isinstance(handler, BaseHandler):
        return None
    if getattr(handler, "_token_authenticated", False):
        token = handler.get_token()
        return token.session_id if token is not None and token.session_id else None
    return handler.get_session_cookie() or None


class PortalAuthenticator(Authenticator):
    portal_url = Unicode(config=True, help="How the hub reaches the portal.")
    service_token = Unicode(config=True, help="The token shared by the hub and the portal.")
    session_check_age = Integer(
        300,
        config=True,
        help="Seconds a browser's hub login stands on the portal's last 'live' before it is asked "
        "again (JupyterHub's own refresh age, kept per user, is 1 second here).",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # (hub user, hub session id or None) -> monotonic time its "live" answer stands until.
        self._live_until: dict[tuple[str, str | None], float] = {}

    @default("auth_refresh_age")
    def _refresh_at_every_request(self) -> int:
        # JupyterHub's refresh time is per user: one browser's refresh would vouch for the
        # user's other browsers. `refresh_user` keeps a per-browser answer instead.
        return 1

    @default("auth_refresh_strict")
    def _refresh_strictly(self) -> bool:
        # A stale login is refused on token-authenticated requests too (the single-user server
        # checking its OAuth token with the hub): else JupyterLab outlives the portal session.
        return True

    async def authenticate(
        self, handler: web.RequestHandler, data: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        token = handler.get_argument("login_token", default="")
        if not token:
            raise web.HTTPError(403, "Open your workspace from the Baseline portal.")
        if not isinstance(handler, BaseHandler):  # JupyterHub's login handler always is one
            raise TypeError("PortalAuthenticator logs in through JupyterHub's login handler")
        # The login cookie JupyterHub sets next keeps this session id (it makes one only if none).
        hub_session = handler.get_session_cookie() or handler.set_session_cookie()
        try:
            answer = await call(
                self.portal_url,
                self.service_token,
                "/hub-service/redeem",
                {"token": token, "hub_session": hub_session},
            )
        except PortalRefused as exc:
            self.log.warning("login token refused by the portal: %s", exc.message)
            raise web.HTTPError(403, exc.message) from exc
        # An observer's login carries the role for the one server they may see (manage_roles).
        if isinstance(answer.get("roles"), list):
            return {"name": str(answer["user"]), "roles": answer["roles"]}
        return {"name": str(answer["user"])}

    async def refresh_user(self, user: Any, handler: web.RequestHandler | None = None) -> bool:
        """True while the portal says the portal session behind this browser's hub login lives;
        False (a new login from the portal is needed) once it has expired or been revoked."""
        hub_session = hub_session_of(handler)
        key = (user.name, hub_session)
        now = time.monotonic()
        if self._live_until.get(key, 0.0) > now:
            return True
        live = await self._ask_portal(user.name, hub_session)
        if live:
            self._live_until = {k: t for k, t in self._live_until.items() if t > now}
            self._live_until[key] = now + self.session_check_age
        return live

    async def _ask_portal(self, hub_user: str, hub_session: str | None) -> bool:
        query = {"user": hub_user} | ({"hub_session": hub_session} if hub_session else {})
        path = f"/hub-service/session?{urlencode(query)}"
        try:
            answer = await call(self.portal_url, self.service_token, path)
        except PortalRefused as exc:
            if exc.status >= 500:  # the portal is down or failing: not an expired session
                self.log.warning("portal session of %s not checked: %s", hub_user, exc.message)
                return True
            self.log.warning("portal session of %s refused: %s", hub_user, exc.message)
            return False
        if answer.get("live") is True:
            return True
        self.log.info("portal session of %s has ended: hub login refused", hub_user)
        return False

    def get_handlers(self, app: Any) -> list[tuple[str, type]]:
        return [(r"/logout", PortalLogoutHandler), (r"/token", NoTokenPage)]
