"""The hub's authenticator: the portal is the identity provider (JupyterHub's forced-login).

There is no login form: `auto_login` makes ``/hub/login`` call `authenticate` directly, which reads
the one-time ``login_token`` the portal put in the URL and redeems it with the portal. The portal
answers with the hub user name only if the token is fresh, unused and for the participant's own
live attempt; anything else is a 403 from the hub, and the participant goes back to the portal.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.auth import Authenticator
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.login import LogoutHandler
from tornado import web
from traitlets import Unicode

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

    def get_handlers(self, app: Any) -> list[tuple[str, type]]:
        return [(r"/logout", PortalLogoutHandler), (r"/token", NoTokenPage)]
