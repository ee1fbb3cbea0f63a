"""Scoring a Task Standard family in the task's own environment, as Vivaria scores it.

Vivaria runs ``score``/``intermediate_score``/``aggregate_scores`` inside the running task
environment, so a family's scoring may read what ``start()`` put anywhere (``/root``, ``/opt``,
``/home/agent``) and the agent's files of any size. A fresh scoring container holding only the
submission snapshot loses all of that (and files over the snapshot's size limit), and scores
differ with no error. So a family is scored in a short-lived container of its attempt's saved
state: the workspace's file system committed as an image (`infra.family_run.commit_state`,
everything but its volumes) with the attempt's own submission volume, whole, mounted read-only
and copied into ``/home/submission`` (``/home/agent`` links to it) before the hook runs as root.

That container, not the participant's workspace, gets `SCORING_CAPABILITIES`: root in a workspace
has none (``no-new-privileges``), and the Task Standard's scoring runs as a root that reads the
agent's files whatever their mode, ``chown``s to ``agent`` and runs the agent's code as ``agent``
(``runuser -u agent``, ``subprocess.run(user="agent")``). It has no network, the attempt's memory,
the GPUs its caller holds for it (``gpu_ids``: the live workspace's for an intermediate score,
ones taken from the pool for the final score, `baseline.grading.family_environment`), and is
removed when the hook ends or its time-out passes.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Mapping, Sequence

import docker

from infra.family_run import (
    STATE_REPOSITORY,
    FamilyRunError,
    commit_state,
    final_state_tag,
    remove_state,
    run_once,
    scoring_state_tag,
    state_image,
)
from infra.workspace import SUBMISSION_DIR
from scoring.scored_task import ScoringSpec
from scoring.scoring_run import ScoringError, ScoringResult, _interpret
from scoring.task_standard import HOOK_NAME
from scoring.task_standard_hook import FAMILY_HOME

HOOK_PATH = f"{FAMILY_HOME}/{HOOK_NAME}"  # where launch put the hook beside the family
MOUNTED_SUBMISSION = "/mnt/baseline-submission"  # the volume, read-only; copied before scoring
# What the Task Standard's root needs to score: read and write the agent's files whatever their
# mode and owner (DAC_OVERRIDE, FOWNER), chown to agent (CHOWN), and run as agent (SETUID,
# SETGID). Given only to the scoring container.
SCORING_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID")


def save_final_state(client: docker.DockerClient, container_id: str) -> str:
    """Save the ended attempt's environment before its teardown, as Vivaria scores before it; it
    is removed with the workspace's container."""
    try:
        return commit_state(client, container_id, final_state_tag(container_id))
    except FamilyRunError as exc:
        raise ScoringError(str(exc)) from exc


def score_in_environment(
    client: docker.DockerClient,
    *,
    container_id: str,
    submission_volume: str,
    spec: ScoringSpec,
    files: Mapping[str, bytes],
    memory_mb: int,
    final: bool = False,
    gpu_ids: Sequence[str] = (),
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> ScoringResult:
    """Run the family's scoring command (`spec`) in the attempt's environment; its result.

    `final`: in the state saved when the attempt ended (`save_final_state`); otherwise, or when
    that is not on this engine, in the container's state now, saved for this one scoring.
    `files` (paths relative to the family at /root: the score log) are put there first.
    `gpu_ids` are the GPUs it gets (nvidia-smi indexes; none by default), `name` its container's
    name, after which the state saved for it is tagged (`infra.family_run.scoring_state_tag`);
    both carry `labels` (the deployment's, whose sweep may remove them should this process die).
    """
    tag = final_state_tag(container_id) if final else None
    try:
        if tag is None or state_image(client, tag) is None:
            # Its own tag: two scorings of one attempt at once must not remove each other's.
            # Named after its container, when that has a name, so that one name removes both.
            tag = (
                scoring_state_tag(name)
                if name is not None
                else f"{STATE_REPOSITORY}:{container_id[:12]}-now-{uuid.uuid4().hex[:8]}"
            )
            commit_state(client, container_id, tag, labels)
            owned = True
        else:
            owned = False
        command = spec.render_command(HOOK_PATH, SUBMISSION_DIR)
        script = (
            f"cp -a {MOUNTED_SUBMISSION}/. {shlex.quote(SUBMISSION_DIR)}/ && exec sh -c "
            f"{shlex.quote(command)}"
        )
        try:
            done = run_once(
                client,
                tag,
                ["sh", "-c", script],
                workdir=SUBMISSION_DIR,
                timeout_s=spec.timeout_s,
                cap_add=SCORING_CAPABILITIES,
                volumes_ro={submission_volume: MOUNTED_SUBMISSION},
                files={f"{FAMILY_HOME}/{path}": data for path, data in files.items()},
                memory=f"{memory_mb}m",
                gpu_ids=gpu_ids,
                name=name,
                labels=dict(labels or {}),
            )
        finally:
            if owned:
                remove_state(client, tag)
    except FamilyRunError as exc:
        raise ScoringError(f"scoring in the task's environment could not run: {exc}") from exc
    # The hook's result is stdout's last line; stderr (warnings, a traceback) goes before it.
    output = done.stderr + done.stdout
    return _interpret(spec, done.exit_code, done.exit_code is None, output)
