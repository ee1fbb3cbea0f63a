"""Studies: their settings and checkpoints, participants, and the agents enrolled in them."""
