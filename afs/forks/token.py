"""The fork server's bearer token over HTTP, when none is configured: made once, kept in
AFS_HOME with mode 0600, read by AFS's own clients on the same machine.

    token = ensure_token(settings.fork_server_token_file)   # `afs mcp serve --http`
    token = read_token(settings.fork_server_token_file)     # the fork client; None if absent

The fork server hands out every fork's DSN with its password and deletes forks, so it
answers nobody without the token, loopback included (any local process can reach
loopback). The file is created with O_CREAT|O_EXCL and mode 0600, under a temporary name,
then linked into place: it is never readable by others, not even for an instant, and a
reader never sees it half written. A token file that others may read is refused.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from afs.errors import ConfigError

TOKEN_BYTES = 32


def read_token(path: Path) -> str | None:
    """The token kept at `path`; None when there is none. ConfigError when the file is not
    private to this user (it would be a token every local user knows)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the fork server's token {path}: {exc}") from exc
    with os.fdopen(fd) as file:
        info = os.fstat(file.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"{path} holds the fork server's token but other users may read it "
                              f"(mode {stat.filemode(info.st_mode)}): delete it, a new one is made "
                              "at the next start, or set AFS_FORK_SERVER_TOKEN")
        token = file.read().strip()
    return token or None


def ensure_token(path: Path) -> str:
    """The token kept at `path`, made first if there is none (secrets.token_urlsafe)."""
    existing = read_token(path)
    if existing is not None:
        return existing
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
        try:
            os.link(draft, path)  # atomic, and it fails if another server made one meanwhile
        except FileExistsError:
            found = read_token(path)
            if found is None:
                raise ConfigError(f"{path} is empty: delete it, a new token is made at the next start") \
                    from None
            return found
    finally:
        draft.unlink(missing_ok=True)
    return token
