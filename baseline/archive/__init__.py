"""Study archives: one self-describing file with everything behind a study's numbers, participants
pseudonymised, that another home imports (every hash checked) and an analyst reads without a
database; and agent runs as Inspect AI evaluation logs."""
