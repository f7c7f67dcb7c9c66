"""A throwaway PostgreSQL server for the tests and bench.state_db: initdb on a temporary
directory, pg_ctl start on a free port, trust authentication on localhost only, removed on stop.

    with ThrowawayPostgres() as pg:
        pg.url          # postgresql://postgres@127.0.0.1:PORT/postgres
        pg.stop()       # the server goes away (the data stays): what "the database went down" looks like
        pg.start()      # and comes back on the same port with the same data

The binaries come from the system's PostgreSQL (`initdb` on PATH, else the newest
/usr/lib/postgresql/*/bin). PostgreSQL refuses to run as root; as root the server runs as the
`postgres` user the system package creates. `postgres_unavailable()` says why none can start here
(tests skip on it: a condition of the machine).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

RUN_AS = "postgres"  # the system package's user, for a test run as root


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(candidates[-1]).parent if candidates else None


def postgres_unavailable() -> str | None:
    """Why no throwaway server can start on this machine, or None."""
    if _bin_dir() is None:
        return "PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return "PostgreSQL is not installed for root to use (running as root and no `postgres` user)"
    return None


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (read from /proc: a server's backends and workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state, past the command's parentheses
        children.setdefault(parent, []).append(int(entry))
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop()
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThrowawayPostgres:
    def __init__(self, port: int | None = None):
        reason = postgres_unavailable()
        if reason:
            raise RuntimeError(reason)
        self.bin = _bin_dir()
        self.port = port or _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            user = pwd.getpwnam(RUN_AS)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.running = False

    def postmaster_pid(self) -> int | None:
        """The server's main process (its backends are its children), while it runs."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """The URL of a new, empty database on this server (so no user of it sees another's rows)."""
        import uuid

        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self._as_root:
            command = ["runuser", "-u", RUN_AS, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> ThrowawayPostgres:
        # fsync off and a small footprint: a test server, thrown away; the unix socket lives in the temp dir.
        options = (
            f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off -c synchronous_commit=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self.running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            self.running = False

    def pause(self) -> None:
        """SIGSTOP the server and its backends: connections stay open and the kernel still takes bytes, but
        nothing answers (a frozen host). `resume()` undoes it."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, signum: int) -> None:
        main = self.postmaster_pid()
        if main is None:
            raise RuntimeError("the server is not running")
        for pid in [main, *_descendants(main)]:
            os.kill(pid, signum)

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
