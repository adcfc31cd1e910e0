"""Sandbox storage: forks clone where the filesystem has reflinks, copy elsewhere, and
`afs sandbox up --cow` moves the sandbox onto an XFS image file of its own (root only)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from afs.config import Settings, load_settings, parse_size
from afs.db import open_connection
from afs.errors import ConfigError
from afs.sandbox.server import SandboxServer
from afs.sandbox.storage import CowImage, CowUnavailable, fork_method
from afs.testing import Child, run_afs


def afs(*args: str, home: Path, user: int | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    # user: the same command as another (non-root) user
    return run_afs(*args, env={**os.environ, "AFS_SCALE": "small"}, home=home, child=Child(as_user=user),
                   check=check, text=True)


def can_loop_mount(home: Path) -> None:
    try:
        CowImage(load_settings({"AFS_HOME": str(home)})).check_can_mount()
    except CowUnavailable as exc:
        pytest.skip(f"the clone path needs root, loop devices and mkfs.xfs: {exc}")


NOBODY = 65534  # an unprivileged user (uid and gid)


def used_mb(path: Path) -> float:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize / 1048576


# -- settings (pure) ---------------------------------------------------------------------------
def test_sizes_and_cow_settings() -> None:
    assert parse_size("100G") == 100 * 1024 ** 3 and parse_size("512M") == 512 * 1024 ** 2
    assert parse_size("1.5T") == int(1.5 * 1024 ** 4) and parse_size("2GiB") == 2 * 1024 ** 3
    with pytest.raises(ValueError):
        parse_size("lots")
    settings = load_settings({"AFS_HOME": "/tmp/afs-none", "AFS_COW": "1", "AFS_COW_SIZE": "20G"})
    assert settings.cow and settings.cow_size_bytes == 20 * 1024 ** 3
    assert not load_settings({"AFS_HOME": "/tmp/afs-none"}).cow
    with pytest.raises(ConfigError, match="cow_size"):
        load_settings({"AFS_HOME": "/tmp/afs-none", "AFS_COW_SIZE": "big"})
    with pytest.raises(ConfigError, match="cow must be"):
        load_settings({"AFS_HOME": "/tmp/afs-none", "AFS_COW": "maybe"})


def test_a_bad_cow_size_is_a_usage_error(own_home: Path) -> None:
    result = afs("sandbox", "up", "--cow", "--cow-size", "huge", home=own_home, check=False)
    assert result.returncode == 2 and "not a size" in result.stderr
    result = afs("sandbox", "up", "--cow", "--cow-size", "100M", home=own_home, check=False)
    assert result.returncode == 2 and "at least 512M" in result.stderr
    assert not any(own_home.iterdir())  # nothing made


# -- the session's sandbox: whatever its filesystem gives ---------------------------------------
def test_status_reports_the_method_the_server_uses(sandbox: SandboxServer, settings: Settings) -> None:
    result = subprocess.run([sys.executable, "-m", "afs", "sandbox", "status", "--json"],
                            capture_output=True, text=True, check=True, timeout=60)
    info = json.loads(result.stdout)

    async def server_setting() -> str:
        async with open_connection(sandbox.dsn()) as conn:
            return str(await conn.fetchval("SHOW file_copy_method"))

    assert info["fork_method"] == trio.run(server_setting) == fork_method(settings.pgdata)
    assert info["fork_method"] in ("clone", "copy")


def test_without_root_up_cow_says_what_to_do_and_keeps_copying(own_home: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to run the command as an unprivileged user) and setpriv")
    if fork_method(own_home) == "clone":
        pytest.skip(f"{own_home} has reflinks already: nothing to say there")
    os.chown(own_home, NOBODY, NOBODY)
    try:
        result = afs("sandbox", "up", "--cow", "--json", home=own_home, user=NOBODY)
        info = json.loads(result.stdout)
        assert info["running"] and info["fork_method"] == "copy" and info["cow_image"] is None
        assert "needs root" in info["cow_note"] and "sudo afs sandbox up --cow" in info["cow_note"]
        assert "XFS" in info["cow_note"] and "btrfs" in info["cow_note"]
        assert not (own_home / "sandbox.xfs").exists()
    finally:  # its own server, stopped by its own user
        afs("sandbox", "down", home=own_home, user=NOBODY)


# -- the clone path: an XFS image of the sandbox's own -----------------------------------------
def test_up_cow_moves_the_sandbox_onto_an_image_and_forks_clone(own_home: Path) -> None:
    can_loop_mount(own_home)
    first = json.loads(afs("sandbox", "up", "--json", home=own_home).stdout)
    assert first["cow_image"] is None
    before = first["fork_method"]

    moved = json.loads(afs("sandbox", "up", "--cow", "--cow-size", "1G", "--json", home=own_home).stdout)
    assert moved["running"] and moved["fork_method"] == "clone" and moved["cow_note"] is None
    # the demo data came along: the same size, give or take what the server wrote meanwhile
    # (two separate readings: autovacuum's maps and statistics may add a few pages between them)
    assert first["size_mb"] > 10 and moved["size_mb"] == pytest.approx(first["size_mb"], abs=1.0)
    image = CowImage(load_settings({"AFS_HOME": str(own_home)}))
    if before == "copy":  # ext4 and the like: the sandbox now lives on its own image
        assert moved["cow_image"] == str(image.image) and image.mounted()
        assert not image.old.exists() and not image.moving.exists()
        assert image.image.stat().st_blocks * 512 < 512 * 1024 ** 2  # sparse

    # a fork adds next to nothing to the disk before it changes anything
    used = used_mb(own_home / "sandbox")
    fork = json.loads(afs("fork", "create", "--json", home=own_home).stdout)
    added = used_mb(own_home / "sandbox") - used
    afs("fork", "destroy", fork["name"], home=own_home)
    assert added < 5, f"a fork added {added:.1f} MB"

    # down leaves the image mounted (up needs no root then); down --unmount detaches it
    assert "unmounted" not in json.loads(afs("sandbox", "down", "--json", home=own_home).stdout)
    if image.exists():
        assert image.mounted()
        off = json.loads(afs("sandbox", "down", "--unmount", "--json", home=own_home).stdout)
        assert off["unmounted"] and not image.mounted() and not image.loop_devices()
        again = json.loads(afs("sandbox", "up", "--json", home=own_home).stdout)  # mounts it again
        assert again["running"] and again["fork_method"] == "clone" and image.mounted()
        assert again["size_mb"] == pytest.approx(first["size_mb"], abs=1.0)  # as above: two readings


def test_an_interrupted_move_is_rolled_back_on_the_next_start(own_home: Path) -> None:
    can_loop_mount(own_home)
    settings = load_settings({"AFS_HOME": str(own_home)})
    server = SandboxServer(settings)
    server.init()
    marker = settings.pgdata / "afs_marker"
    marker.write_text("the old directory")
    image = CowImage(settings)
    # the state a move killed after the switch leaves behind: old kept, the new image in place
    image._make_image(512 * 1024 ** 2)
    settings.sandbox_dir.rename(image.old)
    image._mount(image.target)
    assert image.mounted() and not marker.exists()

    assert server.start()  # recovers first: the old directory is back, the image gone
    assert marker.read_text() == "the old directory"
    assert not image.exists() and not image.old.exists() and not image.mounted()
    assert server.status().running and server.stop()


# -- imports land on the same storage, and say how far they got ---------------------------------
async def test_an_import_reports_progress_and_lands_where_forks_are_made(sandbox: SandboxServer) -> None:
    from afs.forks.provider import LocalForkProvider
    from afs.sandbox.importer import import_database

    said: list[str] = []
    try:
        report = await import_database(sandbox, sandbox.dsn("afs_demo"), "progress_copy",
                                       progress=said.append)
        assert report.database == "progress_copy"
        async with open_connection(sandbox.dsn()) as conn:
            source_mb = await conn.fetchval("SELECT pg_database_size('afs_demo') / 1048576.0")
            where = await conn.fetchval("SELECT current_setting('data_directory')")
        copied = [re.fullmatch(r"importing: (\d+) MB dumped, (\d+) MB of about (\d+) MB restored", m)
                  for m in said[:-1]]
        assert copied and all(copied), said
        assert all(abs(int(m.group(3)) - float(source_mb)) <= 1 for m in copied if m)
        assert said[-1] == "importing: copied; analysing the tables"
        assert where == str(sandbox.pgdata)  # the sandbox's own data directory, clone or copy
    finally:
        await LocalForkProvider(sandbox.dsn()).drop_source("progress_copy")
