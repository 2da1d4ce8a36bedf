"""`python -m specpilot …`: the same as the `specpilot` command."""

from specpilot.cli import main

main()
