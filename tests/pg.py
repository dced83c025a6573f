"""A real PostgreSQL server for tests: a throwaway `infercept.pg_local.LocalPostgres` (Debian's
`postgresql` binaries, which scripts/install.sh installs where it can; a temporary folder, a free loopback
port, trust authentication, fsync off). `PgServer.find()` says why not, when it cannot run here, so the
tests that need it skip with that reason."""

from __future__ import annotations

from infercept.pg_local import USER, LocalPostgres, free_port

PgServer = LocalPostgres
_free_port = free_port

__all__ = ["USER", "PgServer", "_free_port"]
