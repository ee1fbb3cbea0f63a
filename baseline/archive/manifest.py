"""The archive's manifest: what every file of the archive is and its sha256, so a reader can
check that nothing was changed since the export (`baseline.archive.reader` does, each file as
it is read, and all of them before an import).

The manifest is the one member not listed in itself; its own sha256 is printed on export, for
publishing beside the archive.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

# 2: the monitor's settings, alerts and alert deliveries (`tables.TableSpec.since`).
SCHEMA_VERSION = 2
MANIFEST_NAME = "manifest.json"
README_NAME = "README.md"


class ArchiveFile(BaseModel):
    """One member of the archive: its path inside it, its size and its sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ArchivedStudy(BaseModel):
    """The study as it was named and numbered in the home it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int
    name: str


class ArchiveOptions(BaseModel):
    """What the exporter chose to include beyond the default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notes: bool = False  # free-text notes: pause notes and expert graders' leaf notes
    recordings: bool = False  # humans' terminal recordings and shell histories


class ArchiveManifest(BaseModel):
    """The archive's table of contents (``manifest.json``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    archive_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    created_at: datetime
    baseline_version: str
    study: ArchivedStudy
    options: ArchiveOptions
    # How participants are named in the archive: their study pseudonyms, which were random when
    # drawn and tell nothing about who they are.
    pseudonyms: str = "study pseudonyms (random labels drawn at enrolment)"
    files: list[ArchiveFile]
    # Blobs the rows name that the exporting home's store did not hold (a synthetic study's
    # made-up snapshot digests, say): absent there too, not lost on the way.
    absent_blobs: list[str] = Field(default_factory=list)

    def by_path(self) -> dict[str, ArchiveFile]:
        return {f.path: f for f in self.files}
