"""A leaf's plan counts its prompt's tokens by parts (scoring.judge.prompts): each preceding
criterion once, the answer format once per category. The parts end lines, so the sums must equal
the exact counts of the assembled text; any text where they do not would shift file budgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.judge.prompts import (
    judgement_model,
    preceding_frame,
    preceding_item,
    preceding_part,
    requirement_head,
    requirement_part,
)
from scoring.llm import Tokenizer, schema_instructions
from scoring.rubric import TaskCategory

TOKENS = Tokenizer()
# Rubric-like text, with the whitespace, punctuation and non-Latin script that decide where a
# BPE pre-tokenizer splits.
TEXT = st.text(
    alphabet=st.sampled_from(list("ab Zz09.,:;-_()[]{}>/\\'\"\n\t\r é漢字ü+=*#`")), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, max_size=6))
def test_preceding_criteria_count_as_the_sum_of_their_lines(items: list[str]) -> None:
    head, tail = preceding_frame()
    by_parts = (
        TOKENS.count(head)
        + TOKENS.count(tail)
        + sum(TOKENS.count(preceding_item(t)) for t in items)
    )
    assert TOKENS.count(preceding_part(items)) == by_parts


@settings(max_examples=200, deadline=None)
@given(TEXT, st.sampled_from(list(TaskCategory)))
def test_a_requirement_counts_as_its_head_plus_the_answer_format(
    requirement: str, category: TaskCategory
) -> None:
    answer_format = TOKENS.count(schema_instructions(judgement_model(category)))
    by_parts = TOKENS.count(requirement_head(requirement, category)) + answer_format
    assert TOKENS.count(requirement_part(requirement, category)) == by_parts
