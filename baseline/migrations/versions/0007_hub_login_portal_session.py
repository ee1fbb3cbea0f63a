"""a hub login bound to the portal session that made it

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 21:00:00

Adds ``user_session_id`` (the portal session that issued the login token) and
``hub_session_hash`` (the sha256 of the hub's session id of the browser that redeemed it) to
hub_login_tokens: the hub's refresh asks about that one portal session, so that logging out,
revoking or expiring it ends the hub login in that browser and not in the user's others. Rows
stored before have neither: the hub logins they made are refused at their next refresh, and the
participant opens the workspace from the portal again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hub_login_tokens") as batch:
        batch.add_column(sa.Column("user_session_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("hub_session_hash", sa.String(length=64), nullable=True))
        batch.create_foreign_key(
            "fk_hub_login_tokens_user_session_id",
            "user_sessions",
            ["user_session_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index("ix_hub_login_tokens_hub_session_hash", ["hub_session_hash"])


def downgrade() -> None:
    with op.batch_alter_table("hub_login_tokens") as batch:
        batch.drop_index("ix_hub_login_tokens_hub_session_hash")
        batch.drop_constraint("fk_hub_login_tokens_user_session_id", type_="foreignkey")
        batch.drop_column("hub_session_hash")
        batch.drop_column("user_session_id")
