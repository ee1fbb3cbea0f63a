"""Acceptance: one time-scaled study driven through the portal in Chromium by each role in turn.

Real components throughout: the portal (threaded WSGI server), JupyterHub with
configurable-http-proxy, Docker workspaces and reproductions on the local engine, the snapshot
scheduler (APScheduler, the study database as its job store), the judge talking HTTP to the local
fake OpenAI server, SQLite. The admin adds the Docker host; the coordinator imports the demo paper
task and its scored variant on the Tasks page (folder archives), creates the study with its judge
(the connection checked) and those tasks, invites a participant (the link is followed in the
browser), enrols an agent configuration, creates and launches the participant's attempt; the
participant opens JupyterLab, writes their submission in its terminal, pauses, resumes and
submits; the checkpoints fall due on the time-scaled clock and are taken; every snapshot is
reproduced and judged, and the coordinator sees the judged scores in the study's attempt list; a
grader grades every leaf of a snapshot under its pseudonym; an analyst sees the curves and
downloads the tidy table. The coordinator never needs the CLI (issue 40's acceptance).

What is not a role's action is done by the test: creating the staff accounts, and waiting for
background work (the reproduction and judging queue is run here, as the portal's worker would).

Every page visited is kept as a PNG under ``$BASELINE_SCREENSHOTS/study-in-browser`` when that is
set (CI keeps the folder as an artifact), else under the test's temporary folder.
"""

from __future__ import annotations

import csv
import functools
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import launch
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.jobs import orchestration
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    GradingKind,
    JobStatus,
    Participant,
    ParticipantKind,
    Role,
    Snapshot,
    SnapshotKind,
)
from baseline.people import accounts
from baseline.tasks.tasks import DEMO_TASKS_DIR
from tests.app.chromium import TERMINAL_CARD, chromium, console_errors, open_lab_terminal
from tests.docker_env import docker_url, test_image
from tests.fake_openai import FakeOpenAI
from tests.hub_world import HubWorld, database_url, factory, settings, world
from tests.scoring.judge_support import is_ranking, scripted_answer

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.browser]
__all__ = ["database_url", "settings", "test_image", "world"]  # fixtures used below

STAFF_PASSWORD = "staff-password-1"
PARTICIPANT = ("Pat Participant", "pat@test.example", "participant-password-1")
TIME_SCALE = 1200  # one wall second is 20 working minutes
# Due 3 and 6 wall seconds after the clock starts; the participant writes reproduce.sh once both
# are taken. The last (72 wall seconds) comes after the submission: the analyst carries the final
# forward.
CHECKPOINT_HOURS = (1.0, 2.0, 24.0)
TAKEN = 2  # checkpoints certainly due before the submission
MARKER = "lr_accuracy 0.95"  # printed only when the participant's reproduce.sh runs


def judge_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A leaf passes exactly when its prompt shows what the participant's reproduce.sh printed;
    the portal's connection check is answered as it asks."""
    if is_ranking(body):
        return scripted_answer(body)
    if str(body["messages"][-1]["content"]).startswith("# Connection check"):
        return {"ok": True}
    seen = MARKER in str(body["messages"][-1]["content"])
    return {
        "expectations": "the reproduction's output",
        "reality": "shown" if seen else "absent",
        "score": 1 if seen else 0,
        "explanation": "scripted",
    }


class Pages:
    """The browser, with a numbered full-page screenshot of every page it lands on."""

    def __init__(self, driver: Any, base: str, folder: Path) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.base, self.folder, self.by = driver, base, folder, By
        self.wait = functools.partial(WebDriverWait, driver)
        self.count = 0
        folder.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str) -> None:
        self.count += 1
        height = self.driver.execute_script("return document.body.scrollHeight")
        self.driver.set_window_size(1400, max(1000, min(int(height), 6000)))
        self.driver.save_screenshot(str(self.folder / f"{self.count:02d}-{name}.png"))

    def go(self, path: str, name: str) -> None:
        self.driver.get(self.base + path)
        self.shot(name)

    def css(self, selector: str) -> Any:
        return self.driver.find_element(self.by.CSS_SELECTOR, selector)

    def xpath(self, expression: str) -> Any:
        return self.driver.find_element(self.by.XPATH, expression)

    def fill(self, values: dict[str, str]) -> None:
        for name, value in values.items():
            field = self.css(f"[name='{name}']")
            field.clear()
            field.send_keys(value)

    def press(self, button_text: str, name: str | None, form: str = "") -> None:
        """Click the button with this text (in the form whose action ends with `form`), and keep
        a screenshot of the page it leads to (unless `name` is None: the caller waits first)."""
        scope = f"//form[substring(@action, string-length(@action) - {len(form) - 1}) = '{form}']"
        target = f"{scope if form else ''}//button[normalize-space()='{button_text}']"
        old = self.driver.find_element(self.by.TAG_NAME, "html")
        self.xpath(target).click()
        self.wait(30).until(lambda d: _stale(old))
        if name is not None:
            self.shot(name)

    def follow(self, link: Any) -> None:
        """Click an element that leads to another page, and wait until the old page is gone:
        reading the page while the browser is between the two finds no body at all."""
        old = self.driver.find_element(self.by.TAG_NAME, "html")
        link.click()
        self.wait(30).until(lambda d: _stale(old))

    def choose(self, select_name: str, text_part: str, form: str = "") -> None:
        from selenium.webdriver.support.ui import Select

        scope = f"form[action$='{form}'] " if form else ""
        menu = Select(self.css(f"{scope}select[name='{select_name}']"))
        menu.select_by_visible_text(next(o.text for o in menu.options if text_part in o.text))

    def login(self, email: str, password: str, who: str) -> None:
        self.go("/login", f"{who}-login")
        self.fill({"email": email, "password": password})
        self.press("Log in", f"{who}-home")
        assert "/login" not in self.driver.current_url, self.text()

    def logout(self) -> None:
        old = self.driver.find_element(self.by.TAG_NAME, "html")
        self.xpath("//form[contains(@action, '/logout')]//button").click()
        self.wait(30).until(lambda d: _stale(old))

    def text(self) -> str:
        return str(self.driver.find_element(self.by.TAG_NAME, "body").text)

    def flash(self) -> str:
        return " ".join(e.text for e in self.driver.find_elements(self.by.CSS_SELECTOR, ".flash"))


def _stale(element: Any) -> bool:
    """Whether the page that held `element` is gone. While the browser swaps documents,
    chromedriver may answer with an inspector error that the node "does not belong to the
    document" instead of a stale reference: that says the same (it failed a CI run)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in (exc.msg or ""):
            return True
        raise
    return False


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def _screenshot_folder(tmp_path: Path) -> Path:
    root = os.environ.get("BASELINE_SCREENSHOTS")
    return Path(root) / "study-in-browser" if root else tmp_path / "screenshots"


def test_a_time_scaled_study_through_the_portal_by_every_role(
    world: HubWorld,
    ctx: Context,
    test_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    # The admin's account work: the staff of the study.
    with ctx.session() as session:
        for role in (Role.ADMIN, Role.COORDINATOR, Role.GRADER, Role.ANALYST):
            accounts.create_user(
                session, f"{role.value}@test.example", role.value.title(), STAFF_PASSWORD, role
            )
    # Workspaces and reproductions carry the test labels, so that none outlives the test.
    monkeypatch.setattr(
        launch,
        "launch",
        functools.partial(launch.launch, image=test_image, backend_factory=factory),
    )
    monkeypatch.setenv("FAKE_JUDGE_KEY", "not-a-real-key")
    folder = _screenshot_folder(tmp_path)
    shutil.rmtree(folder, ignore_errors=True)  # this run's pages only
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    scheduler = SnapshotScheduler(ctx, resolve_source, sweep_every_s=1)
    scheduler.start()
    try:
        with FakeOpenAI(answer=judge_answer) as model, chromium() as driver:
            driver.set_page_load_timeout(180)
            pages = Pages(driver, world.portal_url, folder)
            _admin_adds_the_host(pages)
            study_id, invitation = _coordinator_sets_up_the_study(pages, model.base_url, tmp_path)
            _participant_accepts(pages, invitation)
            attempt_id = _coordinator_launches_the_attempt(pages, ctx, study_id)
            _participant_works_pauses_resumes_and_submits(pages, world, ctx, attempt_id)
            final_score = _reproduced_and_judged(ctx, attempt_id)
            _coordinator_sees_the_scores(pages, study_id, attempt_id, final_score)
            _grader_grades_blind(pages, ctx)
            _analyst_sees_curves_and_downloads(pages, study_id, final_score, downloads)
            assert console_errors(driver) == []
    finally:
        scheduler.shutdown()
    shots = sorted(folder.glob("*.png"))
    print(f"{len(shots)} screenshots in {folder}; {time.monotonic() - started:.0f} s")
    assert len(shots) >= 25 and all(s.stat().st_size > 5_000 for s in shots)


def _admin_adds_the_host(pages: Pages) -> None:
    pages.login("admin@test.example", STAFF_PASSWORD, "admin")
    pages.go("/admin/hosts/", "admin-hosts")
    pages.fill({"name": "engine", "docker_url": docker_url("unix")})
    pages.press("Add", "admin-host-added")
    pages.press("Check now", "admin-host-checked")
    assert "engine is healthy" in pages.flash(), pages.flash()
    pages.logout()


def _coordinator_sets_up_the_study(pages: Pages, model_url: str, tmp_path: Path) -> tuple[int, str]:
    pages.login("coordinator@test.example", STAFF_PASSWORD, "coordinator")
    pages.go("/tasks/", "coordinator-tasks")
    for slug in ("digits-baselines", "digits-accuracy"):  # the bundled tasks, as folder archives
        archive = tmp_path / f"{slug}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(DEMO_TASKS_DIR / slug, arcname=slug)
        pages.css("input[name='archive']").send_keys(str(archive))
        pages.press("Import", f"coordinator-imported-{slug}")
        assert f"Imported: {slug}" in pages.flash(), pages.flash()
    pages.go("/studies/new", "coordinator-new-study")
    pages.fill(
        {
            "name": "Browser study",
            "checkpoint_hours": ", ".join(f"{h:g}" for h in CHECKPOINT_HOURS),
            "working_time_limit_hours": "48",
            "time_scale": str(TIME_SCALE),
            # The judge, checked when the study is created (the fake server's key variable).
            "judge_base_url": model_url,
            "judge_model": "fake-judge",
            "judge_api_key_env": "FAKE_JUDGE_KEY",
            "judge_input_usd_per_mtok": "1",
            "judge_output_usd_per_mtok": "4",
        }
    )
    pages.choose("egress_policy", "No network")
    pages.press("Create study", "coordinator-study-created")
    assert "The judge answered: fake-judge" in pages.flash(), pages.flash()
    study_id = int(pages.driver.current_url.rstrip("/").rsplit("/", 1)[1])
    for slug in ("digits-baselines", "digits-accuracy"):
        pages.choose("task_id", slug, form="/tasks")
        pages.press("Add task", f"coordinator-added-{slug}")
    body = pages.text()
    assert "Small Models, Solid Digits" in body and "digits-accuracy" in body
    assert "graded by fake-judge" in body and "needs a judge" not in body

    pages.fill({"email": PARTICIPANT[1]})
    pages.choose("role", "participant")
    pages.press("Create invitation link", "coordinator-invited")
    flash = pages.flash()
    assert "Invitation link" in flash, flash
    invitation = next(w for w in flash.split() if "/invite/" in w)

    pages.choose("scaffold", "basic")
    pages.fill(
        {
            "name": "Fake agent",
            "model": "fake-model",
            "endpoint": model_url,
            "runs_per_task": "1",
            "setting_input_usd_per_mtok": "1",
            "setting_output_usd_per_mtok": "4",
        }
    )
    pages.press("Enrol agent", "coordinator-agent-enrolled")
    assert "Agent enrolled with 2 attempts" in pages.flash(), pages.flash()
    pages.logout()
    return study_id, invitation


def _participant_accepts(pages: Pages, invitation: str) -> None:
    pages.driver.get(invitation)
    pages.shot("participant-invitation")
    name, email, password = PARTICIPANT
    pages.fill({"name": name, "password": password})
    assert pages.css("[name='email']").get_attribute("value") == email  # bound by the link
    pages.press("Create account", "participant-welcome")
    assert "Your account is ready" in pages.flash(), pages.text()
    pages.logout()


def _coordinator_launches_the_attempt(pages: Pages, ctx: Context, study_id: int) -> int:
    pages.login("coordinator@test.example", STAFF_PASSWORD, "coordinator-again")
    pages.go(f"/studies/{study_id}", "coordinator-study")
    pages.choose("participant_id", PARTICIPANT[0])
    pages.choose("task_id", "digits-baselines", form="/attempts")
    pages.press("New attempt", "coordinator-attempt-created")
    with ctx.session() as session:
        attempt_id = session.scalar(
            select(Attempt.id)
            .join(Participant)
            .where(Participant.kind == ParticipantKind.HUMAN, Attempt.study_id == study_id)
        )
    assert attempt_id is not None
    pages.go(f"/attempts/{attempt_id}", "coordinator-attempt")
    pages.press("Launch workspace", "coordinator-launched")
    assert "Workspace ready" in pages.flash(), pages.text()
    pages.logout()
    return int(attempt_id)


def _participant_works_pauses_resumes_and_submits(
    pages: Pages, world: HubWorld, ctx: Context, attempt_id: int
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support import expected_conditions as ec

    driver = pages.driver
    _, email, password = PARTICIPANT
    pages.login(email, password, "participant")
    pages.go("/attempts/", "participant-attempts")
    pages.follow(pages.xpath(f"//a[normalize-space()='{attempt_id}']"))
    pages.shot("participant-attempt-ready")
    pages.follow(pages.xpath("//a[contains(@href, '/paper')]"))
    pages.shot("participant-task")
    body = pages.text()
    assert "Small Models, Solid Digits" in body and "Addendum" in body
    assert "Notes for the judge" not in body
    driver.back()

    # Before the first login: the study's consent text (terminal sessions are recorded).
    pages.follow(pages.css("#consent-link a"))
    assert "shell history" in pages.text()
    pages.css("input[name=accept]").click()
    pages.follow(pages.css("#accept-consent"))
    assert "Consent recorded" in pages.text()

    # JupyterLab opens in this tab, under the work page's bar; writing there starts nothing the
    # portal has not seen.
    pages.css("#open-workspace").click()
    wait = pages.wait(180)
    wait.until(lambda d: d.current_url.endswith(f"/attempts/{attempt_id}/work"))
    driver.switch_to.frame("lab")
    wait.until(lambda d: "/lab" in d.execute_script("return location.href"))
    wait.until(ec.element_to_be_clickable((pages.by.XPATH, TERMINAL_CARD)))
    pages.shot("participant-jupyterlab")
    open_lab_terminal(driver, wait)
    screen = (pages.by.CSS_SELECTOR, ".jp-Terminal .xterm-screen")
    wait.until(ec.presence_of_element_located(screen))
    driver.find_element(*screen).click()
    # The checkpoints fall due on the scaled clock while the participant works, before they
    # write reproduce.sh: on an idle machine JupyterLab's terminal is up within 6 wall seconds,
    # and a checkpoint taken after the write showed the marker (the curve's 0 at 2 h failed).
    _until(lambda: len(_checkpoints(ctx, attempt_id)) >= TAKEN, 60, "checkpoints")
    ActionChains(driver).send_keys(f"echo 'echo {MARKER}' > reproduce.sh\n").perform()
    participant = _as_participant(world, ctx, attempt_id)
    _until(lambda: world.workspace_file(participant, "reproduce.sh"), 60, "reproduce.sh")
    driver.switch_to.default_content()
    pages.shot("participant-terminal")
    pages.go(f"/attempts/{attempt_id}", "participant-attempt-running")
    pages.fill({"note": "lunch"})
    pages.press("Pause clock", "participant-paused")
    assert "paused" in pages.text()
    pages.press("Resume clock", "participant-resumed")
    pages.css("[name='confirm']").click()
    pages.press("Submit", "participant-submitted", form="/submit")
    assert "Submitted: final snapshot" in pages.flash(), pages.text()
    pages.logout()
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.SUBMITTED
        reasons = [p.reason.value for p in attempt.pauses]
        assert "participant" in reasons or "break" in reasons, reasons


def _as_participant(world: HubWorld, ctx: Context, attempt_id: int) -> Any:
    from tests.hub_world import Participant as HubParticipant

    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        user_id = attempt.participant.user_id
        assert user_id is not None
    return HubParticipant(user_id, PARTICIPANT[1], attempt_id)


def _checkpoints(ctx: Context, attempt_id: int) -> list[float]:
    with ctx.session() as session:
        return list(
            session.scalars(
                select(Snapshot.due_working_s).where(
                    Snapshot.attempt_id == attempt_id, Snapshot.kind == SnapshotKind.CHECKPOINT
                )
            )
        )


def _reproduced_and_judged(ctx: Context, attempt_id: int) -> float:
    """The portal's worker: reproduce every snapshot in a fresh container, then judge it."""
    report = orchestration.process_queue(ctx, backend_factory=factory)
    assert report.errors == []
    with ctx.session() as session:
        rows = session.scalars(
            select(Grading)
            .join(Snapshot)
            .where(Snapshot.attempt_id == attempt_id, Grading.kind == GradingKind.JUDGE)
        ).all()
        assert rows and all(g.status is JobStatus.SUCCEEDED for g in rows), [g.error for g in rows]
        scores = {
            (kind, due): score
            for kind, due, score in session.execute(
                select(Snapshot.kind, Snapshot.due_working_s, Grading.score)
                .join(Grading)
                .where(Snapshot.attempt_id == attempt_id, Grading.kind == GradingKind.JUDGE)
            )
        }
        final = next(v for (kind, _), v in scores.items() if kind is SnapshotKind.FINAL)
        first = scores[(SnapshotKind.CHECKPOINT, CHECKPOINT_HOURS[0] * 3600)]
        # Three wall seconds in, JupyterLab was not even up: nothing to run, so nothing shown.
        # The submitted reproduce.sh ran and printed the marker: leaves that see its log pass.
        assert first == 0.0 and final is not None and final > 0.5, scores
    return float(final)


def _coordinator_sees_the_scores(
    pages: Pages, study_id: int, attempt_id: int, final_score: float
) -> None:
    """The judged scores, in the study's attempt list: no CLI, no click per attempt."""
    pages.login("coordinator@test.example", STAFF_PASSWORD, "coordinator-scores")
    pages.go(f"/studies/{study_id}", "coordinator-study-scored")
    row = pages.xpath(f"//table[@id='attempts']//tr[td/a[normalize-space()='{attempt_id}']]")
    assert f"{final_score:.3f}" in row.text and "(judge)" in row.text, row.text
    pages.logout()


def _grader_grades_blind(pages: Pages, ctx: Context) -> None:
    pages.login("grader@test.example", STAFF_PASSWORD, "grader")
    pages.go("/grading/", "grader-queue")
    assert PARTICIPANT[0] not in pages.text()
    pages.follow(
        pages.xpath("//tr[td[normalize-space()='final submission']]//a[normalize-space()='Grade']")
    )
    pages.shot("grader-snapshot")
    page = pages.driver.page_source
    assert PARTICIPANT[0] not in page and PARTICIPANT[1] not in page and "human" not in page
    radios = pages.driver.find_elements(pages.by.CSS_SELECTOR, "input[type=radio][value='1']")
    assert len(radios) == 22  # every leaf of the demo rubric
    for radio in radios:
        pages.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", radio)
        radio.click()
    pages.press("Save my grades", "grader-saved")
    assert "22 grade(s) saved" in pages.flash(), pages.flash()
    with ctx.session() as session:
        expert = session.scalars(select(Grading).where(Grading.kind == GradingKind.EXPERT)).one()
        assert expert.leaves_graded == 22 and expert.score == 1.0
    pages.logout()


def _analyst_sees_curves_and_downloads(
    pages: Pages, study_id: int, final_score: float, downloads: Path
) -> None:
    driver = pages.driver
    pages.login("analyst@test.example", STAFF_PASSWORD, "analyst")
    pages.follow(pages.xpath("//nav//a[normalize-space()='Analysis']"))  # the latest study
    _plotted(pages)
    pages.shot("analyst-dashboard")
    assert pages.css("select[name='study'] option[selected]").text == "Browser study"
    assert _mean_curve(pages)[-1] == 0.0  # at 2 h, nothing ran yet; 24 h was not reached

    # The participant submitted before 24 h: carried forward, the final score is the last point.
    pages.css("input[name='carry_forward']").click()
    pages.press("Apply", None)
    _plotted(pages)
    pages.shot("analyst-carried-forward")
    curve = _mean_curve(pages)
    assert curve[0] == 0.0 and curve[-1] == pytest.approx(final_score), curve

    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    pages.xpath("//a[normalize-space()='CSV']").click()
    table = _until(lambda: next(iter(downloads.glob("*.csv")), None), 30, "the CSV download")
    rows = [
        r for r in csv.DictReader(io.StringIO(table.read_text())) if r["study_id"] == str(study_id)
    ]
    human = [r for r in rows if r["task"] == "digits-baselines" and r["score"] not in ("", None)]
    assert max(float(r["score"]) for r in human) == pytest.approx(final_score), rows
    pages.logout()


def _plotted(pages: Pages) -> None:
    pages.wait(60).until(
        lambda d: d.find_elements(pages.by.CSS_SELECTOR, ".js-plotly-plot .main-svg")
    )


def _mean_curve(pages: Pages) -> list[float]:
    """The y values of the human mean in the first figure (score against working time)."""
    traces = pages.driver.execute_script(
        # _fullData: the traces as drawn, with the JSON's base64 arrays decoded.
        "return document.querySelector('.js-plotly-plot')._fullData"
        ".map(t => ({name: t.name || '', y: Array.from(t.y || [])}))"
    )
    mean = next(t for t in traces if "mean" in t["name"])
    return [float(y) for y in mean["y"] if y is not None]
