"""Load a study from a remote portal into the same `StudyData` an analyst gets locally.

The tidy table comes as Parquet (column types kept), the settings from the study's JSON, the
judge-versus-expert agreement from its own route; `analysis.load_study(..., url=, token=)`
calls this.
"""

from __future__ import annotations

import io

import pandas as pd

from analysis.table import StudyData
from baseline.portal_client import PortalClient


def load_remote(
    client: PortalClient, study: str | int, hourly_rate: float | None = None
) -> StudyData:
    study_id = client.study_id(str(study))
    settings = client.get(f"/studies/{study_id}")
    table = pd.read_parquet(io.BytesIO(client.request("GET", f"/studies/{study_id}/table.parquet")))
    rate = settings["human_hourly_rate_usd"] if hourly_rate is None else hourly_rate
    if hourly_rate is not None and len(table):
        human = table["participant_kind"] == "human"
        # As `analysis.table` prices a human's row: working hours at the rate, no API cost.
        table.loc[human, "human_cost_usd"] = table.loc[human, "working_hours"] * hourly_rate
        table.loc[human, "cost_usd"] = table.loc[human, "human_cost_usd"]
    agreement = pd.DataFrame(client.get(f"/studies/{study_id}/agreement")["rows"])
    return StudyData(
        study_id=study_id,
        name=settings["name"],
        checkpoints=[float(h) for h in settings["checkpoint_hours"]],
        human_hourly_rate_usd=float(rate),
        table=table,
        synthetic=bool(table["synthetic"].any()) if len(table) else False,
        agreement=agreement,
    )
