"""Studies: list, create, configure, enrol participants and agents, invite people."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from sqlalchemy import select

from app import agent_form, form_edits
from app.access import ANY_USER, STAFF, current_user, requires
from app.forms import float_field, float_list_field, text_field
from app.judge_check import check_connection, judge_from_form
from baseline.errors import DomainError, InvalidInput
from baseline.grading import expert_grading
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    EgressPolicy,
    Grading,
    GradingKind,
    JobStatus,
    Participant,
    Role,
    Snapshot,
    Study,
    StudyStatus,
    Task,
    TaskKind,
    User,
)
from baseline.people import accounts, visibility
from baseline.runs import blacklist_monitor
from baseline.studies import agent_enrolment, judge_cost, studies

bp = Blueprint("studies", __name__, url_prefix="/studies")
MAX_INVITATION_HOURS = 24 * 365


def _actor_id() -> int:
    user = current_user()
    assert user is not None
    return user.id


@bp.route("/")
@requires(*ANY_USER)
def index() -> Any:
    user = current_user()
    assert user is not None
    rows = g.db.scalars(visibility.studies_query(user)).all()
    # The distinct limits per study, not every attempt's row: the list stays one small query
    # however many attempts the studies hold.
    visible = visibility.attempts_query(user).subquery()
    pairs = g.db.execute(
        select(visible.c.study_id, visible.c.working_time_limit_s).distinct()
    ).all()
    per_study: dict[int, list[float]] = {}
    for study_id, limit_s in pairs:
        per_study.setdefault(study_id, []).append(limit_s)
    return render_template(
        "studies/index.html",
        studies=rows,
        limits={s.id: AttemptLimits.of(s, per_study.get(s.id, [])) for s in rows},
    )


@dataclass(frozen=True)
class AttemptLimits:
    """The working-time limits to show for a study: its default (what a new attempt gets) and
    the limits its attempts really have. An attempt keeps the limit it was created with, plus
    any extension, so a study whose default changed or whose attempts were extended would
    otherwise show a limit that none of its attempts has (issue 39: "Limit 8 h" beside a
    120 h attempt)."""

    default_hours: float
    attempt_hours: tuple[float, ...]  # the distinct limits of the attempts shown, ascending

    @classmethod
    def of(cls, study: Study, limits_s: Iterable[float]) -> AttemptLimits:
        hours = sorted({round(limit_s / 3600, 2) for limit_s in limits_s})
        return cls(study.working_time_limit_hours, tuple(hours))

    @property
    def differs(self) -> bool:
        """Some attempt's limit is not the study default: show the attempts' own."""
        return any(h != round(self.default_hours, 2) for h in self.attempt_hours)


@bp.route("/new", methods=["GET", "POST"])
@requires(*STAFF)
def create() -> Any:
    if request.method == "POST":
        try:
            spec = studies.StudySpec(
                name=text_field("name", max_length=200),
                description=text_field("description", required=False),
                hardware_profile=text_field("hardware_profile", max_length=64),
                checkpoint_hours=float_list_field("checkpoint_hours", [2.0, 8.0, 32.0, 48.0]),
                snapshot_interval_minutes=float_field("snapshot_interval_minutes"),
                working_time_limit_hours=float_field("working_time_limit_hours", 48.0) or 0.0,
                wall_clock_limit_hours=float_field("wall_clock_limit_hours"),
                time_scale=float_field("time_scale", 1.0) or 0.0,
                egress_policy=request.form.get("egress_policy", "blacklist"),
                idle_pause_minutes=float_field("idle_pause_minutes"),
                snapshot_policy=request.form.get("snapshot_policy", "baseline"),
            )
            judge = judge_from_form(request.form)
            study = studies.create_study(g.db, spec, _actor_id())
            if judge is not None:
                orchestration.set_study_judge(g.db, study, judge, False, _actor_id())
            g.db.commit()
        except DomainError as exc:
            g.db.rollback()
            flash(exc.message, "error")
            return render_template(
                "studies/new.html", form=request.form, policies=list(EgressPolicy)
            ), exc.status_code
        flash(f"Study {study.name!r} created.", "success")
        if judge is not None:
            _flash_check(study)
        return redirect(url_for("studies.detail", study_id=study.id))
    return render_template("studies/new.html", form={}, policies=list(EgressPolicy))


@bp.route("/<int:study_id>/edit", methods=["GET", "POST"])
@requires(*STAFF)
def edit(study_id: int) -> Any:
    """Edit a study's settings: labels and the payout rate any time, what makes attempts
    comparable (checkpoints, limits, profile...) only until the first attempt starts."""
    study = studies.get_study(g.db, study_id)
    started = studies.first_started_attempt(g.db, study)
    if request.method == "POST":
        try:
            changed = studies.edit_study(g.db, study, _edited_settings(study), _actor_id())
            g.db.commit()
        except DomainError as exc:
            g.db.rollback()
            flash(exc.message, "error")
            current = _form_of(study)
            return render_template(
                "studies/edit.html",
                study=study,
                form=form_edits.form_again(request.form, current),
                shown=current,
                started=started,
                fixed=studies.FIXED_ONCE_STARTED,
                policies=list(EgressPolicy),
            ), exc.status_code
        flash(
            f"Changed: {', '.join(sorted(changed))}." if changed else "Nothing changed.", "success"
        )
        return redirect(url_for("studies.detail", study_id=study.id), 303)
    return render_template(
        "studies/edit.html",
        study=study,
        form=_form_of(study),
        shown=_form_of(study),
        started=started,
        fixed=studies.FIXED_ONCE_STARTED,
        policies=list(EgressPolicy),
    )


# How each setting of the edit form is read; a field the form did not send (shown read-only once
# an attempt has started) is left as it is.
_OPTIONAL_FLOATS = ("snapshot_interval_minutes", "wall_clock_limit_hours", "idle_pause_minutes")
_FLOATS = (
    "working_time_limit_hours",
    "time_scale",
    "reproduction_timeout_minutes",
    "human_hourly_rate_usd",
)
_CHOICES = ("egress_policy", "snapshot_policy")


def _edited_settings(study: Study) -> dict[str, Any]:
    """The settings the edit form changed (`app.form_edits`: only what this form's user
    touched), typed; an emptied optional number means "off"."""
    sent = form_edits.changed_fields(request.form, _form_of(study))
    changes: dict[str, Any] = {}
    if "name" in sent:
        changes["name"] = text_field("name", max_length=200)
    if "description" in sent:
        changes["description"] = text_field("description", required=False)
    if "hardware_profile" in sent:
        changes["hardware_profile"] = text_field("hardware_profile", max_length=64)
    if "checkpoint_hours" in sent:
        changes["checkpoint_hours"] = float_list_field("checkpoint_hours", [])
    for name in _OPTIONAL_FLOATS:
        if name in sent:
            changes[name] = float_field(name)
    for name in _FLOATS:
        if name in sent:
            value = float_field(name)
            if value is None:
                raise InvalidInput(f"{name.replace('_', ' ')}: required")
            changes[name] = value
    for name in _CHOICES:
        if name in sent:
            changes[name] = request.form.get(name, "")
    return changes


def _form_of(study: Study) -> dict[str, str]:
    """The study's settings as the edit form shows them."""

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:g}"

    return {
        "name": study.name,
        "description": study.description,
        "hardware_profile": study.hardware_profile,
        "checkpoint_hours": ", ".join(f"{h:g}" for h in study.checkpoint_hours),
        **{name: number(getattr(study, name)) for name in (*_OPTIONAL_FLOATS, *_FLOATS)},
        "egress_policy": study.egress_policy.value,
        "snapshot_policy": study.snapshot_policy,
    }


@bp.route("/<int:study_id>")
@requires(*ANY_USER)
def detail(study_id: int) -> Any:
    return _detail_page(study_id)


def _detail_page(
    study_id: int,
    enrol: Mapping[str, str] | None = None,
    enrol_error: str = "",
    judge_typed: Mapping[str, str] | None = None,
    judge_error: str = "",
) -> str:
    """The study page; `enrol` and `enrol_error`: the enrol-agent form as sent, and why it was
    refused, shown on the form itself; `judge_typed` and `judge_error` the same for the judge's
    form."""
    user = current_user()
    assert user is not None
    study = visibility.visible_study(g.db, user, study_id)
    attempts = g.db.scalars(
        visibility.attempts_query(user).where(Attempt.study_id == study.id)
    ).all()
    staff = user.role in (Role.ADMIN, Role.COORDINATOR)
    addable = studies.addable_tasks(g.db, study) if staff else []
    tasks = studies.study_tasks(g.db, study)
    judge = orchestration.study_judge(study)
    return render_template(
        "studies/detail.html",
        study=study,
        tasks=tasks,
        judge=judge,
        judge_cost=(
            judge_cost.estimate(g.db, study, judge.config, judge.code_dev)
            if staff and judge is not None
            else None
        ),
        scores=latest_scores([a.id for a in attempts]) if staff else {},
        grader_labels={a.id: expert_grading.blind_label(a) for a in attempts} if staff else {},
        # the paper tasks a judge would grade: a synthetic one's scores are drawn, not graded
        paper_tasks=[
            t for t in tasks if t.kind is TaskKind.PAPER and not (t.summary or {}).get("synthetic")
        ],
        addable_tasks=addable,
        study_open=studies.is_open(study),  # the domain's rule: no new tasks, people, attempts
        archived=study.status is StudyStatus.ARCHIVED,  # nothing more judged: no judge form
        attempts=attempts,
        limits=AttemptLimits.of(study, [a.working_time_limit_s for a in attempts]),
        staff=staff,
        statuses=list(StudyStatus),
        status_meaning=studies.STATUS_MEANING,
        roles=invitable_roles(user),
        blacklist_hits=blacklist_monitor.study_hits(g.db, study.id) if staff else [],
        scaffolds=agent_form.scaffold_choices(),
        setting_fields=agent_form.setting_fields(),
        enrol=enrol or {},
        enrol_error=enrol_error,
        judge_shown=judge_fingerprint(judge),
        judge_typed=judge_typed,
        judge_error=judge_error,
    )


def judge_fingerprint(judge: orchestration.StudyJudge | None) -> str:
    """What the judge form names as the judge it showed: the configuration's hash and the
    Code-Dev choice ("none" before a judge is set)."""
    if judge is None:
        return "none"
    return f"{judge.config.config_hash()}:{int(judge.code_dev)}"


@dataclass(frozen=True)
class LatestScore:
    score: float
    working_hours: float
    kind: str


def latest_scores(attempt_ids: list[int]) -> dict[int, LatestScore]:
    """Each attempt's score at its latest judged or script-scored snapshot, so the attempt list
    shows scores without opening every attempt (expert gradings are the graders' page's)."""
    if not attempt_ids:
        return {}
    rows = g.db.execute(
        select(Snapshot.attempt_id, Grading.score, Snapshot.taken_working_s, Grading.kind)
        .join(Grading, Grading.snapshot_id == Snapshot.id)
        .where(
            Snapshot.attempt_id.in_(attempt_ids),
            Grading.kind.in_([GradingKind.JUDGE, GradingKind.SCRIPT]),
            Grading.status == JobStatus.SUCCEEDED,
            Grading.score.is_not(None),
        )
        .order_by(Snapshot.taken_working_s, Grading.id)
    )
    return {
        attempt_id: LatestScore(float(score), taken / 3600, kind.value)
        for attempt_id, score, taken, kind in rows
    }


def invitable_roles(user: User) -> list[Role]:
    """The roles the user may invite someone to: only an admin invites an admin."""
    return [r for r in Role if r is not Role.ADMIN or user.role is Role.ADMIN]


@bp.route("/<int:study_id>/status", methods=["POST"])
@requires(*STAFF)
def change_status(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    try:
        status = StudyStatus(request.form.get("status", ""))
    except ValueError:
        flash("Unknown status.", "error")
        return redirect(url_for("studies.detail", study_id=study_id)), 303
    shown = request.form.get("shown_status")
    if status is study.status:
        flash(f"Study is {status.value} already: nothing changed.", "info")
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    if shown and shown != study.status.value:
        # A stale page's choice (closing an active study) would undo a newer one (archiving)
        flash(
            f"Study is {study.status.value} now, not {shown} as when you opened the page: "
            "someone changed it since, so nothing changed; choose again if you still want to.",
            "error",
        )
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    try:
        studies.set_status(g.db, study, status, _actor_id())
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    flash(f"Study is now {status.value}: {studies.STATUS_MEANING[status]}.", "success")
    return redirect(url_for("studies.detail", study_id=study_id), 303)


def _flash_check(study: Study) -> None:
    """Check the study's judge answers, and say so (a failure is a warning: it is saved)."""
    judge = orchestration.study_judge(study)
    if judge is None:
        flash("This study has no judge to check.", "error")
        return
    result = check_connection(judge.config)
    flash(result.message, "success" if result.ok else "error")


@bp.route("/<int:study_id>/judge", methods=["POST"])
@requires(*STAFF)
def set_judge(study_id: int) -> Any:
    """Set the judge new snapshots of paper tasks are graded with (audited), then check it."""
    study = studies.get_study(g.db, study_id)
    current = orchestration.study_judge(study)
    try:
        judge = judge_from_form(request.form)
        if judge is None:
            raise InvalidInput("judge: give the endpoint (base URL) and the model")
        code_dev = request.form.get("judge_code_dev") == "1"
        if current is not None and (judge.config_hash(), code_dev) == (
            current.config.config_hash(),
            current.code_dev,
        ):
            flash(
                f"The judge is {judge.model} at {judge.base_url} already: nothing changed.", "info"
            )
            _flash_check(study)
            return redirect(url_for("studies.detail", study_id=study_id, _anchor="judge"), 303)
        shown = request.form.get("shown_judge")
        if shown and current is not None and shown != judge_fingerprint(current):
            # Set from a page opened before someone else set the judge: saving would replace
            # theirs unseen. The page comes back with their judge and this form's values over it.
            judge_error = (
                f"The judge was changed since you opened this page: it is {current.config.model}"
                f" at {current.config.base_url} now. Nothing was saved; the form shows what you "
                "typed: save again to replace their judge with yours."
            )
            return _detail_page(study_id, judge_typed=request.form, judge_error=judge_error), 409
        orchestration.set_study_judge(g.db, study, judge, code_dev, _actor_id())
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        return _detail_page(study_id, judge_typed=request.form, judge_error=exc.message), (
            exc.status_code
        )
    flash(f"Judge set: {judge.model} at {judge.base_url}.", "success")
    _flash_check(study)
    return redirect(url_for("studies.detail", study_id=study_id, _anchor="judge"), 303)


@bp.route("/<int:study_id>/judge/check", methods=["POST"])
@requires(*STAFF)
def check_judge(study_id: int) -> Any:
    _flash_check(studies.get_study(g.db, study_id))
    return redirect(url_for("studies.detail", study_id=study_id, _anchor="judge"), 303)


@bp.route("/<int:study_id>/tasks", methods=["POST"])
@requires(*STAFF)
def add_task(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    task = g.db.get(Task, request.form.get("task_id", type=int) or 0)
    if task is None:
        flash("Choose a task to add.", "error")
    else:
        try:
            studies.add_task(g.db, study, task, _actor_id())
            g.db.commit()
            flash(f"Task {task.slug} added.", "success")
        except DomainError as exc:
            g.db.rollback()
            flash(exc.message, "error")
    return redirect(url_for("studies.detail", study_id=study_id), 303)


@bp.route("/<int:study_id>/agents", methods=["POST"])
@requires(*STAFF)
def add_agent(study_id: int) -> Any:
    """Enrol an agent configuration: with runs per task, validated and its attempts created at
    once; without, the participant only (attempts are then created one by one). A refusal is
    shown on the form, with what was typed."""
    study = studies.get_study(g.db, study_id)
    try:
        scaffold = request.form.get("scaffold", "")
        settings = agent_form.settings_from_form(request.form, scaffold)
        runs = text_field("runs_per_task", required=False, max_length=10)
        name = text_field("name", max_length=200)
        model = text_field("model", max_length=200)
        endpoint = text_field("endpoint", required=False, max_length=500)
        if runs:
            made = agent_enrolment.enrol(
                g.db, study, name=name, scaffold=scaffold, model=model, endpoint=endpoint,
                settings=settings, runs_per_task=_int(runs, "runs_per_task"),
                actor_id=_actor_id(),
            )  # fmt: skip
            done = f"Agent enrolled with {len(made.attempt_ids)} attempts."
        else:
            agent_enrolment.add_configuration(
                g.db, study, name=name, scaffold=scaffold, model=model, endpoint=endpoint,
                settings=settings, actor_id=_actor_id(),
            )  # fmt: skip
            done = "Agent enrolled."
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        return _detail_page(study_id, enrol=request.form, enrol_error=exc.message), (
            exc.status_code
        )
    flash(done, "success")
    return redirect(url_for("studies.detail", study_id=study_id), 303)


def _int(raw: str, name: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name.replace('_', ' ')}: must be a whole number") from None


@bp.route("/<int:study_id>/attempts", methods=["POST"])
@requires(*STAFF)
def create_attempt(study_id: int) -> Any:
    """Assign a task to a participant (human or agent); the attempt is launched from its page."""
    study = studies.get_study(g.db, study_id)
    participant = g.db.get(Participant, request.form.get("participant_id", type=int) or 0)
    task = g.db.get(Task, request.form.get("task_id", type=int) or 0)
    if participant is None or participant.study_id != study.id or task is None:
        flash("Choose a participant of this study and a task.", "error")
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    try:
        attempt = studies.create_attempt(g.db, participant, task, _actor_id())
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    flash(f"Attempt {attempt.id} created; launch it when ready.", "success")
    return redirect(url_for("attempts.detail", attempt_id=attempt.id), 303)


@bp.route("/<int:study_id>/invitations", methods=["POST"])
@requires(*STAFF)
def invite(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    user = current_user()
    assert user is not None
    try:
        role = accounts.parse_role(request.form.get("role", "participant"))
        if role is Role.ADMIN and user.role is not Role.ADMIN:
            raise DomainError("only an admin may invite an admin")
        hours = float_field("ttl_hours", 72.0)
        if hours is None or not 0 < hours <= MAX_INVITATION_HOURS:
            raise DomainError(
                f"Valid for (hours): more than 0 and at most {MAX_INVITATION_HOURS} "
                f"(a year); got {hours:g}"
            )
        email = text_field("email", required=False, max_length=320) or None
        _invitation, secret = accounts.create_invitation(
            g.db, role, timedelta(hours=hours), user.id, study.id, email
        )
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return redirect(url_for("studies.detail", study_id=study_id), 303)
    link = url_for("auth.invitation", token=secret, _external=True)
    flash(f"Invitation link (shown once, single use): {link}", "success")
    return redirect(url_for("studies.detail", study_id=study_id), 303)
