"""The `tandem` command: one typer app (`app`) and one module per command group
(`serve`, `cloud`, `config`, `eval`, `router`); `python -m sdk.cli` runs it too.
Heavy imports stay inside the commands."""
