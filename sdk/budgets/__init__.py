"""Spend limits per API key and per `user` within a key (issue 26): USD and cloud share per UTC
day or month, soft (a warning) and hard (refused, or answered locally). `config` reads the
budgets file, `ledger` keeps the spend (persisted), `manager` decides per request."""
