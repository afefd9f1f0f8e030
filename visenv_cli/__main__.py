"""`python -m visenv_cli ...`: the same as the `visenv` command."""

from visenv_cli import main

main()
