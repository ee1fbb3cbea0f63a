"""Grading: reproductions, the judge's and the experts' gradings, EXP-Bench grading, scoring
scripts, and how often Baseline's own failures are retried."""
