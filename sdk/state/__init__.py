"""State that the replicas of a server share through one PostgreSQL database (`state_db`): the
spend ledger and budget reservations, rate-limit buckets, requests in flight, failed-key backoff.
Unset, each process keeps these itself (SQLite files and memory), as the embedded default does."""
