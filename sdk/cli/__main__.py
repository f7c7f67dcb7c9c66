"""`python -m sdk.cli ...`: the `tandem` command (tests and benches start servers this way)."""

from sdk.cli.app import app

app()
