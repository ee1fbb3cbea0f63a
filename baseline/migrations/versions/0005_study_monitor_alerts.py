"""the study monitor: per-study settings, alerts and their deliveries

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 12:00:00

Adds ``monitor_settings`` (a study's budget, alert thresholds, e-mail recipients and webhook),
``alerts`` (each firing of a rule for a subject, with when it cleared and who acknowledged it)
and ``alert_deliveries`` (each e-mail or webhook delivery of a firing or clearing).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import baseline.models

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "monitor_settings",
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("budget_usd", sa.Float(), nullable=True),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("email_to", sa.JSON(), nullable=False),
        sa.Column("webhook_url", sa.String(length=500), nullable=True),
        sa.Column("webhook_secret", sa.String(length=200), nullable=True),
        sa.Column("updated_at", baseline.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_by_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["updated_by_id"], ["users.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("study_id"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.Enum(
            "workspace_dead", "idle", "snapshot_late", "failure_rate", "queue_age", "host_down",
            "spend", name="alertrule", native_enum=False, length=32,
        ), nullable=False),
        sa.Column("subject", sa.String(length=100), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fired_at", baseline.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", baseline.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_at", baseline.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_by_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["acknowledged_by_id"], ["users.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_alerts_open", "alerts", ["study_id", "rule", "subject", "cleared_at"], unique=False
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=500), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("at", baseline.models.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["alert_id"], ["alerts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_alert_deliveries_alert_id", "alert_deliveries", ["alert_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_alert_deliveries_alert_id", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alerts_open", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("monitor_settings")
