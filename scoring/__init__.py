"""Rubrics, reproduction, the LLM judge, grading, scored tasks and judge evaluation."""
