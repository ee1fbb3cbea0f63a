"""The README inside an archive: what each file is, how participants are named, what was left
out, and how to check and read it, for a reader who has never seen Baseline."""

from __future__ import annotations

from baseline.archive.manifest import MANIFEST_NAME, SCHEMA_VERSION, ArchiveOptions
from baseline.archive.redact import ADDRESS as _ADDRESS
from baseline.archive.redact import REDACTED
from baseline.archive.tables import NOTES, PERSONAL, SECRET

_TABLES = {
    "studies": "the study's settings: checkpoints, limits, time scale, judge settings "
    "(judge_config), human hourly rate, snapshot policy",
    "tasks": "each task with its content hash (its version), scoring settings and summary",
    "task_files": "each task file (paper, rubric, instructions, scoring code) with its sha256; "
    "the content is blobs/<sha256>",
    "study_tasks": "which tasks belong to the study",
    "participants": "humans and agent configurations by pseudonym, kind and analysis group; "
    "agents' scaffold, model, endpoint and limits",
    "attempts": "one participant on one task: status, limits, time scale, hardware profile, "
    "image digest, start and end",
    "pauses": "each pause of an attempt's working clock, with its reason",
    "snapshots": "each capture of a submission: when (working and wall time) and its manifest "
    "(blobs/<manifest_sha256>, listing every file by sha256)",
    "reproductions": "each reproduction run of a snapshot: status, exit code, duration, "
    "failure class, image digest, its log (blobs/<log_sha256>)",
    "gradings": "each grading (judge, script or expert) with its score, floor reason, leaf "
    "counts, category scores, cost, and its configuration (the judge's model and every "
    "setting, and their hash)",
    "leaf_grades": "each rubric leaf's grade with the judge's explanation and details",
    "model_calls": "the cost ledger: every model call (agents and judge) with tokens and cost",
    "score_logs": "intermediate scores of scored tasks, at the working time they were asked",
    "agent_runs": "each built-in agent run with its settings (model, prices, limits)",
    "transcript_entries": "each agent step: messages, tool calls, tool outputs (larger outputs in "
    "blobs/<output_sha256>), tokens and cost",
    "terminal_recordings": "humans' terminal sessions and shell histories (content is the "
    "sha256 of blobs/<sha256>)",
    "monitor_settings": "the study's monitor settings: budget and each alert rule's threshold, "
    "when they were last changed, and the webhook's host (recipients and signing key left out)",
    "alerts": "each alert that fired: its rule, subject, message, when it fired, when it "
    "cleared, and when it was acknowledged",
    "alert_deliveries": "each delivery of an alert's firing or clearing by e-mail or webhook: "
    "when, how many tries, whether it arrived, the error",
    "workspace_images": "the image (tag and digest) and hardware profile each workspace ran; "
    "not imported (it describes machines, not results)",
}
_RESULTS = {
    "tidy": "the analysis' tidy table: one row per measurement of one attempt (snapshot, "
    "intermediate score, or expected checkpoint never reached), exactly as the portal's "
    "analysis computed it",
    "agreement": "judge against expert, per snapshot graded by both",
}


def text(study: str, options: ArchiveOptions, members: list[str], blobs: int) -> str:
    lines = [
        f"# Study archive: {study}",
        "",
        f"Written by Baseline (archive schema version {SCHEMA_VERSION}).",
        "",
        f"`{MANIFEST_NAME}` lists every other file with its size and sha256; check them with "
        "`sha256sum` or let `baseline study import-archive` do it (a changed file is refused).",
        "",
        "## Participants",
        "",
        "Participants appear only by their study pseudonym (`P-…`, drawn at random at "
        "enrolment). Names, e-mail addresses and account ids are not in the archive: the "
        "columns "
        + ", ".join(f"{t}.{c}" for t, cs in sorted(PERSONAL.items()) for c in sorted(cs))
        + " are left out. Snapshots hold what participants wrote in their submission folder.",
        "",
        "## Secrets",
        "",
        "Secrets are never in the archive: the columns "
        + ", ".join(f"{t}.{c}" for t, cs in sorted(SECRET.items()) for c in sorted(cs))
        + " are left out. In "
        + ", ".join(f"{t}.{c}" for t, cs in sorted(REDACTED.items()) for c in sorted(cs))
        + " every URL is cut to its scheme, host and port (a webhook URL's path may be its "
        "token, an SMTP URL may hold a password), every e-mail address is replaced by "
        f"`{_ADDRESS}`, and participants are named by their pseudonyms. Hosts are not in the "
        "archive: an alert names one as its subject does (`host:3` is host 3), without its name "
        "or its error (which may hold its address, user name, port or key path).",
        "",
        "## Left out unless asked",
        "",
        "- free-text notes ("
        + ", ".join(f"{t}.{c}" for t, cs in sorted(NOTES.items()) for c in sorted(cs))
        + ", expert graders' leaf notes): "
        + ("included" if options.notes else "left out (empty text)"),
        "- terminal recordings and shell histories: "
        + ("included" if options.recordings else "left out"),
        "",
        "## Files",
        "",
    ]
    for member in members:
        name = member.rsplit("/", 1)[-1].removesuffix(".parquet")
        if member.startswith("tables/"):
            lines.append(f"- `{member}`: {_TABLES.get(name, name)}")
        elif member.startswith("results/"):
            lines.append(f"- `{member}`: {_RESULTS.get(name, name)}")
    lines += [
        f"- `blobs/<sha256>` ({blobs} files): content named by its sha256 (task files, "
        "snapshot manifests and files, logs, tool outputs"
        + (", recordings" if options.recordings else "")
        + ")",
        "",
        "Tables are Parquet. Times are ISO 8601 text with their zone; JSON columns are JSON "
        "text; ids are the exporting home's, and every foreign key names a row of the archive.",
        "",
    ]
    return "\n".join(lines)
