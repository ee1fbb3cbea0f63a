"""`python -m baseline` is the `baseline` command."""

from baseline.cli import main

main()
