"""The hub's authenticator: the portal is the identity provider (JupyterHub's forced-login).

There is no login form: `auto_login` makes ``/hub/login`` call `authenticate` directly, which reads
the one-time ``login_token`` the portal put in the URL and redeems it with the portal. The portal
answers with the hub user name only if the token is fresh, unused and for the participant's own
live attempt; anything else is a 403 from the hub, and the participant goes back to the portal.

The hub login lasts no longer than the portal's: at JupyterHub's auth refresh age (every
`auth_refresh_age`, 5 minutes) `refresh_user` asks the portal whether the user still holds a live
portal session, and a session that expired or was revoked without a logout (which ends the hub
user outright, `infra.hub.hub_api.end_user`) ends the hub login: the hub's pages, and with
`auth_refresh_strict` the server's own token checks too (JupyterLab's requests, after the
server's token cache of 5 minutes), send the person back to the portal. Their server keeps
running (a training job is not killed by an expired cookie); a terminal's websocket opened before
stays open until it closes. A portal that does not answer (or answers 5xx) is not an expired
session: the login stands until the next refresh asks again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from jupyterhub.auth import Authenticator
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.login import LogoutHandler
from tornado import web
from traitlets import Unicode, default

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


class PortalAuthenticator(Authenticator):
    portal_url = Unicode(config=True, help="How the hub reaches the portal.")
    service_token = Unicode(config=True, help="The token shared by the hub and the portal.")

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
        try:
            answer = await call(
                self.portal_url, self.service_token, "/hub-service/redeem", {"token": token}
            )
        except PortalRefused as exc:
            self.log.warning("login token refused by the portal: %s", exc.message)
            raise web.HTTPError(403, exc.message) from exc
        # An observer's login carries the role for the one server they may see (manage_roles).
        if isinstance(answer.get("roles"), list):
            return {"name": str(answer["user"]), "roles": answer["roles"]}
        return {"name": str(answer["user"])}

    async def refresh_user(self, user: Any, handler: web.RequestHandler | None = None) -> bool:
        """True while the portal says the user holds a live portal session; False (a new login
        from the portal is needed) once it has expired or been revoked."""
        path = f"/hub-service/session?user={quote(user.name)}"
        try:
            answer = await call(self.portal_url, self.service_token, path)
        except PortalRefused as exc:
            if exc.status >= 500:  # the portal is down or failing: not an expired session
                self.log.warning("portal session of %s not checked: %s", user.name, exc.message)
                return True
            self.log.warning("portal session of %s refused: %s", user.name, exc.message)
            return False
        if answer.get("live") is True:
            return True
        self.log.info("portal session of %s has ended: hub login refused", user.name)
        return False

    def get_handlers(self, app: Any) -> list[tuple[str, type]]:
        return [(r"/logout", PortalLogoutHandler), (r"/token", NoTokenPage)]
