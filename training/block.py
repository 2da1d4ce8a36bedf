"""`python -m training.block ...`: the block drafter's training command.

The command lives in training/cli.py (its module doc describes the pipeline and the flags);
this module only gives it the name it runs under.
"""

from training.cli import main

if __name__ == "__main__":
    main()
