"""Snapshot capture into the content-addressed blob store, and export, restore, verify and diff.

One module a job: `manifest` (what a snapshot is, read back), `collector` (the core the three
captures share), `tar_capture`, `directory_capture` and `listing_capture` (the three sources),
`reading` (export, restore, verify, diff). What other packages use is re-exported here.

A snapshot is a manifest (one entry per kept path: size, mode, sha256, mtime; symlinks with their
target) stored as a blob itself, so one digest names a whole snapshot. File contents are blobs, so
identical files are stored once across all snapshots of all attempts.

Captures read a tar stream (what every workspace backend returns for /home/submission) or walk a
directory (the persisted submission volume of a dead workspace). Nothing is ever extracted: paths
that would escape (``..``, absolute names, names under a symlink), links, FIFOs and devices,
unreadable or oversized files, paths longer than the system can create, ignored folders (virtual
environments, caches) are recorded in the manifest's ``skipped`` list with the reason and size,
never followed, never written.

The participant controls the tree while it is read, so nothing here trusts a path string twice:
the directory walk and the restore open every level relative to its parent's descriptor with
``O_NOFOLLOW`` (a directory swapped for a symlink mid-walk is refused, not followed), and entries
are keyed by their raw bytes (two names that print alike are two entries). Exports and restores
never carry setuid/setgid/sticky bits nor a root owner, whatever the manifest says.
"""

from infra.snapshots.directory_capture import capture_directory
from infra.snapshots.listing_capture import Listed, ListingCapture, capture_listing
from infra.snapshots.manifest import (
    EXPORT_ROOT,
    CaptureError,
    CaptureResult,
    ExportPolicy,
    Limits,
    Manifest,
    iter_entries,
    limits_for_policy,
    load_manifest,
)
from infra.snapshots.reading import (
    Diff,
    Problem,
    count_files,
    diff,
    export_tar,
    restore_directory,
    tar_file,
    verify,
)
from infra.snapshots.tar_capture import ChunkReader, archive_reader, capture_archive, capture_tar

__all__ = [
    "EXPORT_ROOT",
    "CaptureError",
    "CaptureResult",
    "ChunkReader",
    "Diff",
    "ExportPolicy",
    "Limits",
    "Listed",
    "ListingCapture",
    "Manifest",
    "Problem",
    "archive_reader",
    "capture_archive",
    "capture_directory",
    "capture_listing",
    "capture_tar",
    "count_files",
    "diff",
    "export_tar",
    "iter_entries",
    "limits_for_policy",
    "load_manifest",
    "restore_directory",
    "tar_file",
    "verify",
]
