"""Tasks: importing paper, scored, EXP-Bench and Task Standard family folders, stored by content,
and what a participant, a grader or the judge may read of them."""
