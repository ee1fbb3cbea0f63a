"""Attempts: their lifecycle and working-time clock, the snapshot schedule and snapshots, launch
(Task Standard families included), freezing a finished workspace, and host outages."""
