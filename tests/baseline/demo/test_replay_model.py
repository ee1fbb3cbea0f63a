"""The replay model answers from its recordings, deterministically, over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from baseline.demo.replay_model import RECORDED, ReplayModel, agent_models, judgement


def _post(replay: ReplayModel, body: dict[str, object]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{replay.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_agent_steps_follow_the_conversation_and_end_past_the_recording() -> None:
    model = agent_models()["digits-baselines"]
    with ReplayModel(think_scale=0.0) as replay:
        first = _post(replay, {"model": model, "messages": [{"role": "user", "content": "go"}]})
        again = _post(replay, {"model": model, "messages": [{"role": "user", "content": "go"}]})
        late = _post(
            replay,
            {"model": model, "messages": [{"role": "assistant", "content": "x"}] * 99},
        )
    assert first[0] == 200 and first[1]["choices"] == again[1]["choices"]
    call = first[1]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "bash" and "reproduce.sh" in json.loads(call["arguments"])["cmd"]
    last = late[1]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert last["name"] == "end_task"


def test_judgements_are_recorded_and_follow_the_evidence_shown() -> None:
    requirement = (
        "The code loads the 8x8 digits data with sklearn.datasets.load_digits "
        "(1,797 images, 64 features, 10 classes)"
    )
    shown = f"# Submission files\n\nx = load_digits()\n\n# Requirement to grade\n\n{requirement}"
    hidden = f"# Submission files\n\n(none)\n\n# Requirement to grade\n\n{requirement}"
    met = judgement("digits-baselines", {"messages": [{"role": "user", "content": shown}]})
    unmet = judgement("digits-baselines", {"messages": [{"role": "user", "content": hidden}]})
    assert (met["score"], unmet["score"]) == (1, 0)
    assert RECORDED in met["explanation"] and RECORDED in unmet["explanation"]


@pytest.mark.parametrize("model", ["gpt-4o", "replay-agent-no-such-task", "replay-judge-x"])
def test_unknown_models_get_a_clear_400(model: str) -> None:
    with ReplayModel() as replay:
        answer = _post(replay, {"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert answer[0] == 400 and answer[1]["error"]["message"]
