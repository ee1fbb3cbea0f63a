"""Baseline: the study domain (studies, tasks, participants, attempts, clock, snapshots, CLI)."""

__version__ = "0.1.0"
