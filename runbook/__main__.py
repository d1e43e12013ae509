"""`python -m runbook`: the `runbook` command line, as the console script runs it."""

from runbook.cli import main

if __name__ == "__main__":
    main()
