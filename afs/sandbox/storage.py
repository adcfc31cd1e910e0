"""Where the sandbox's files live, and whether a fork there is a clone or a copy.

A fork is `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY`. On a filesystem with
reflinks (XFS, btrfs, ZFS, bcachefs) PostgreSQL 18's `file_copy_method = clone`
makes that a copy-on-write clone: milliseconds, and no space until the fork
writes. Elsewhere (ext4, tmpfs, overlayfs) every fork copies every byte.

    fork_method(directory)     "clone" when `cp --reflink=always` works there, else "copy"
    CowImage(settings)         the sandbox on a sparse XFS image file of its own:
        .create_or_move(...)     make the image (mkfs.xfs -m reflink=1), loop-mount it on the
                                 sandbox directory, moving an existing sandbox onto it
        .mount_if_needed()       every start: the image is mounted again after a reboot
        .unmount()               `afs sandbox down --unmount`

The image is `$AFS_HOME/sandbox.xfs`, mounted on `$AFS_HOME/sandbox` (the directory
that holds the data directory and the server log), so every path stays the same
and its existence says where the data lives. Making and mounting it needs root;
without root the sandbox keeps working with full copies and `CowUnavailable` says
what to do instead.

Moving an existing sandbox is safe at every step: the server is stopped, its
directory is copied into the new image mounted aside (`sandbox.moving`), the copy
is verified (every file, its size), then the old directory is renamed to
`sandbox.old`, the image is mounted in its place and the server started; only then
is `sandbox.old` deleted. A move interrupted anywhere is rolled back by the next
start (`recover`): the old directory comes back and the image goes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from afs.config import MIN_COW_SIZE_BYTES, Settings
from afs.errors import SandboxError

ForkMethod = Literal["clone", "copy"]

IMAGE_NAME = "sandbox.xfs"
_TOOL_TIMEOUT_S = 120
_COPY_TIMEOUT_S = 24 * 3600


class CowUnavailable(SandboxError):
    """Copy-on-write storage cannot be set up here (no root, no loop device, no mkfs.xfs)."""


def fork_method(directory: Path) -> ForkMethod:
    """"clone" when a scratch file in `directory` can be reflinked (cp --reflink=always)."""
    source = directory / ".afs_reflink_probe"
    target = directory / ".afs_reflink_probe.copy"
    try:
        source.write_bytes(b"afs")
        result = subprocess.run(["cp", "--reflink=always", str(source), str(target)],
                                capture_output=True, timeout=10)
        return "clone" if result.returncode == 0 else "copy"
    except (OSError, subprocess.TimeoutExpired):
        return "copy"
    finally:
        source.unlink(missing_ok=True)
        target.unlink(missing_ok=True)


def _run(args: list[str], timeout: float = _TOOL_TIMEOUT_S) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or "").strip().splitlines()[-2:]
        raise SandboxError(f"{args[0]} failed (exit {exc.returncode}): {' / '.join(detail)}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{args[0]} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise SandboxError(f"cannot run {args[0]}: {exc}") from exc
    return result.stdout


def _manifest(root: Path) -> dict[str, int]:
    """Every file under `root` (relative path -> size; directories and links as -1)."""
    out: dict[str, int] = {}
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        out[rel] = path.stat().st_size if path.is_file() and not path.is_symlink() else -1
    return out


class CowImage:
    """The sandbox directory on a sparse, loop-mounted XFS image with reflinks (root only)."""

    def __init__(self, settings: Settings) -> None:
        self.home = settings.home
        self.image = settings.home / IMAGE_NAME
        self.target = settings.sandbox_dir  # the mount point
        self.moving = settings.home / "sandbox.moving"  # the new image, mounted aside
        self.old = settings.home / "sandbox.old"  # the old directory, until the new one runs
        self.trash = settings.home / "sandbox.old.delete"

    # -- state -----------------------------------------------------------------------
    def exists(self) -> bool:
        return self.image.exists()

    def mounted(self, mount_point: Path | None = None) -> bool:
        return os.path.ismount(mount_point or self.target)

    def loop_devices(self) -> list[str]:
        """The loop devices attached to this image (exact device names)."""
        if not self.image.exists():
            return []
        out = _run(["losetup", "--noheadings", "--output", "NAME", "--associated", str(self.image)])
        return [line.strip() for line in out.splitlines() if line.strip()]

    def check_can_mount(self) -> None:
        """Raise CowUnavailable, saying what to do instead, unless this process can loop-mount."""
        def unavailable(why: str) -> CowUnavailable:
            return CowUnavailable(
                f"copy-on-write storage needs {why}; forks stay full copies. Either run "
                f"`sudo afs sandbox up --cow` once (AFS_HOME={self.home}), or point AFS_HOME at a "
                "directory on XFS (reflink=1), btrfs or ZFS, where forks are clones by themselves")
        if os.geteuid() != 0:
            raise unavailable("root (to loop-mount an XFS image file)")
        for tool in ("mkfs.xfs", "losetup", "mount", "umount"):
            if shutil.which(tool) is None:
                raise unavailable(f"`{tool}` (apt-get install xfsprogs)" if tool == "mkfs.xfs"
                                  else f"`{tool}`")
        if not Path("/dev/loop-control").exists():
            raise unavailable("loop devices (/dev/loop-control is missing)")

    # -- mounting --------------------------------------------------------------------
    def _mount(self, mount_point: Path) -> None:
        mount_point.mkdir(parents=True, exist_ok=True)
        if any(mount_point.iterdir()):
            raise SandboxError(f"cannot mount {self.image} on {mount_point}: it is not empty")
        device = _run(["losetup", "--find", "--show", str(self.image)]).strip()
        try:
            _run(["mount", "-t", "xfs", "-o", "discard", device, str(mount_point)])
        except SandboxError:
            _run(["losetup", "--detach", device])
            raise

    def _unmount(self, mount_point: Path) -> None:
        if self.mounted(mount_point):
            _run(["umount", str(mount_point)])
        for device in self.loop_devices():
            _run(["losetup", "--detach", device])

    def mount_if_needed(self) -> None:
        """Mount the image on the sandbox directory unless it is mounted (after a reboot)."""
        self.recover()
        if not self.exists() or self.mounted():
            return
        try:
            self.check_can_mount()
        except CowUnavailable:
            raise SandboxError(
                f"the sandbox's data is on the image {self.image}, which is not mounted; mount it "
                f"as root: `sudo afs sandbox up` (or `sudo mount -o loop {self.image} {self.target}`)"
            ) from None
        self._mount(self.target)

    def unmount(self) -> bool:
        """Unmount the image and detach its loop device. Returns True if it was mounted."""
        was = self.mounted()
        self._unmount(self.target)
        return was

    # -- creating, moving, recovering ---------------------------------------------------
    def _make_image(self, size_bytes: int) -> None:
        if size_bytes < MIN_COW_SIZE_BYTES:
            raise SandboxError(f"the image must be at least {MIN_COW_SIZE_BYTES // 1048576} MB")
        self.home.mkdir(parents=True, exist_ok=True)
        scratch = self.image.with_name(self.image.name + ".new")
        scratch.unlink(missing_ok=True)
        with scratch.open("wb") as f:
            f.truncate(size_bytes)  # sparse: takes space only as data is written
        try:
            _run(["mkfs.xfs", "-q", "-m", "reflink=1", str(scratch)])
            scratch.rename(self.image)
        finally:
            scratch.unlink(missing_ok=True)

    def create_or_move(self, size_bytes: int, stop: Callable[[], bool],
                       start: Callable[[], bool], say: Callable[[str], None]) -> None:
        """Put the sandbox directory on a new image; an existing sandbox moves onto it.

        `stop` and `start` stop and start the server (a moved sandbox runs afterwards).
        Raises CowUnavailable (nothing changed) when this process cannot loop-mount.
        """
        self.check_can_mount()
        self.recover()
        if self.exists():
            self.mount_if_needed()
            return
        has_data = self.target.exists() and any(self.target.iterdir())
        if not has_data:
            say(f"making a {size_bytes / 1024 ** 3:g} GB sparse XFS image for the sandbox")
            if self.target.exists():
                self.target.rmdir()
            self._make_image(size_bytes)
            self._mount(self.target)
            return
        stop()
        say(f"moving the sandbox onto a {size_bytes / 1024 ** 3:g} GB sparse XFS image")
        self._make_image(size_bytes)
        try:
            self._mount(self.moving)
            _run(["cp", "-a", "--sparse=always", f"{self.target}/.", f"{self.moving}/"],
                 timeout=_COPY_TIMEOUT_S)
            if _manifest(self.target) != _manifest(self.moving):
                raise SandboxError("the copy of the sandbox on the image differs from the original")
            mode, owner = self.target.stat(), self.target.stat()
            os.chown(self.moving, owner.st_uid, owner.st_gid)
            self.moving.chmod(mode.st_mode & 0o7777)
            self._unmount(self.moving)
            self.moving.rmdir()
            self.target.rename(self.old)
            self._mount(self.target)
            start()  # the copy runs: only now does the old directory go
        except BaseException:
            with contextlib.suppress(SandboxError):
                stop()  # a server that started on the copy before something failed
            self._roll_back()
            raise
        self.old.rename(self.trash)
        shutil.rmtree(self.trash)

    def recover(self) -> None:
        """Roll back a move that did not finish; finish deleting the old directory of one that did."""
        if self.trash.exists():
            shutil.rmtree(self.trash)
        if self.mounted(self.moving):
            self._unmount(self.moving)
        if self.moving.exists():
            self.moving.rmdir()
        if not self.old.exists():
            return
        if self.mounted() and (self.target / "data" / "postmaster.pid").exists():
            # the copy was stopped cleanly, so a pid file there means the new server ran
            self.old.rename(self.trash)
            shutil.rmtree(self.trash)
            return
        self._roll_back()  # the old directory is there and the new one never ran: go back to it

    def _roll_back(self) -> None:
        """Undo a move: the old directory back in its place, the new image gone."""
        if self.mounted(self.moving):
            self._unmount(self.moving)
        if self.moving.exists():
            self.moving.rmdir()
        if self.old.exists():
            if self.mounted():
                self._unmount(self.target)
            if self.target.exists():
                self.target.rmdir()
            self.old.rename(self.target)
        self.image.unlink(missing_ok=True)
