"""/api/v1: one module per resource, all routes on the one `api` blueprint.

Importing a resource module registers its routes on `bp`; the order below is the order of the
OpenAPI document. A new resource is a new module here plus one import line.
"""

from app.api.v1 import (  # noqa: F401  (imported for their routes)
    archives,
    attempts,
    gradings,
    health,
    invitations,
    monitor,
    participants,
    planning,
    reproductions,
    results,
    snapshots,
    studies,
    tasks,
    users,
    workspace,
)
from app.api.v1.common import ERROR_SCHEMA, bp
from app.api.v1.openapi import install as install_openapi

CSRF_EXEMPT = True

__all__ = ["CSRF_EXEMPT", "ERROR_SCHEMA", "bp", "install_openapi"]
