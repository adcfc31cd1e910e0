"""Pure parts: configuration, names, errors, layering. No server, no trio."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import afs
from afs.config import load_settings
from afs.errors import AfsError, ConfigError, InputError, UnknownServiceError, scrub
from afs.forks.naming import InvalidForkName, fork_name, validate_fork_name
from afs.forks.provider import dsn_with
from afs.task import read_weights

PACKAGE = Path(__file__).resolve().parent.parent / "afs"


def test_fork_name_follows_the_seed_pattern() -> None:
    assert fork_name("gemini-2.5-pro", 123, now=1699901234) == "afs-fork-gemini25pro-task123-1699901234"


@pytest.mark.parametrize("name", ["Bad", "x;drop", "a b", "x/y", "x" * 64, "é"])
def test_invalid_fork_names(name: str) -> None:
    with pytest.raises(InvalidForkName):
        validate_fork_name(name)


def test_prefix_is_added() -> None:
    assert validate_fork_name("mine") == "afs-fork-mine"


def test_settings_from_env_and_file(tmp_path: Path) -> None:
    (tmp_path / "settings.yaml").write_text("fork_ttl_seconds: 99\nscale: small\n")
    settings = load_settings({"AFS_HOME": str(tmp_path), "AFS_STATEMENT_TIMEOUT_MS": "1234"})
    assert settings.home == tmp_path.resolve()
    assert settings.fork_ttl_seconds == 99 and settings.scale == "small"
    assert settings.statement_timeout_ms == 1234
    assert settings.target_dsn is None
    assert load_settings({"AFS_HOME": str(tmp_path), "PGHOST": "db"}).target_dsn == ""
    url = "postgresql://u:p@h/db"
    assert load_settings({"AFS_HOME": str(tmp_path), "AFS_DATABASE_URL": url}).target_dsn == url


def test_spares_may_be_turned_off_but_not_negative(tmp_path: Path) -> None:
    assert load_settings({"AFS_HOME": str(tmp_path)}).fork_spares == 3
    assert load_settings({"AFS_HOME": str(tmp_path), "AFS_FORK_SPARES": "0"}).fork_spares == 0
    with pytest.raises(ConfigError, match=r"AFS_FORK_SPARES.*at least 0"):
        load_settings({"AFS_HOME": str(tmp_path), "AFS_FORK_SPARES": "-1"})


@pytest.mark.parametrize("text", ["scale: huge\n", "fork_ttl_seconds: -1\n", "[1, 2\n", "- a\n",
                                  "fork_spares: -2\n"])
def test_bad_settings_file_names_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "settings.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"settings\.yaml") as caught:
        load_settings({"AFS_HOME": str(tmp_path)})
    assert caught.value.exit_code == 2


def test_long_home_moves_the_socket_to_a_short_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    settings = load_settings({"AFS_HOME": str(deep)})
    assert len(str(settings.socket_dir)) < 100
    assert settings.socket_dir != load_settings({"AFS_HOME": str(tmp_path)}).socket_dir


def test_scrub_hides_passwords() -> None:
    assert scrub("postgresql://bob:hunter2@host/db") == "postgresql://bob:***@host/db"
    assert "hunter2" not in scrub("host=x password=hunter2 user=bob")
    assert "hunter2" not in str(AfsError("failed for postgres://a:hunter2@h/d"))


def test_error_tree_exit_codes() -> None:
    assert InputError("x").exit_code == 2
    assert UnknownServiceError("nope").exit_code == 2
    assert "nope" in str(UnknownServiceError("nope", ["afs_demo"]))
    assert AfsError("x").exit_code == 1


def test_fork_dsn_keeps_host_and_swaps_the_rest() -> None:
    socket_dsn = dsn_with("postgresql://postgres@/postgres?host=/tmp/s", dbname="afs-fork-a",
                          user="afs-fork-a", password="p/w")
    assert socket_dsn == "postgresql://afs-fork-a:p%2Fw@/afs-fork-a?host=/tmp/s"
    tcp_dsn = dsn_with("host=db port=5433 user=postgres password=x dbname=postgres",
                       dbname="f", user="f", password="y")
    assert tcp_dsn == "postgresql://f:y@db:5433/f"


# -- the map in afs/__init__.py, held to the code -------------------------------------------
ROOM_LINE = re.compile(r"^    (?P<name>[a-z_]+)(?P<folder>/?)  +\S")
SECTION = re.compile(r"^(?P<title>\S[^:]*?)(:.*)?$")  # a heading: "pure core: no server, …"


def the_map() -> dict[str, tuple[str, bool]]:
    """The rooms the package docstring lists, in order: name -> (section, whether a folder)."""
    rooms: dict[str, tuple[str, bool]] = {}
    section = ""
    for line in (afs.__doc__ or "").splitlines():
        room, heading = ROOM_LINE.match(line), SECTION.match(line)
        if room:
            assert room["name"] not in rooms, f"{room['name']} is listed twice"
            rooms[room["name"]] = (section, bool(room["folder"]))
        elif heading and line.strip():
            section = heading["title"]
    return rooms


def the_code() -> dict[str, bool]:
    """Every module and folder of afs: name -> whether a folder."""
    found = {p.stem: False for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    found |= {p.parent.name: True for p in PACKAGE.glob("*/__init__.py")}
    return found


def test_the_map_lists_every_room_and_only_rooms_that_exist() -> None:
    listed = {name: folder for name, (_, folder) in the_map().items()}
    code = the_code()
    assert sorted(set(code) - set(listed)) == [], "rooms missing from the map in afs/__init__.py"
    assert sorted(set(listed) - set(code)) == [], "the map in afs/__init__.py lists rooms that do not exist"
    assert listed == code, "a folder is written `name/` in the map, a module `name`"


def test_the_map_has_its_sections() -> None:
    sections = {section for section, _ in the_map().values()}
    assert sections == {"pure core", "I/O edges", "workflow", "wings", "entry points"}


def _room_files(room: str) -> list[Path]:
    return sorted((PACKAGE / room).rglob("*.py")) if (PACKAGE / room).is_dir() else [PACKAGE / f"{room}.py"]


def _afs_imports(path: Path) -> set[str]:
    """The afs modules a file imports, anywhere in it (`from afs import x` counts as afs.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("afs.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "afs":
            found |= ({f"afs.{alias.name}" for alias in node.names} if node.module == "afs"
                      else {node.module})
    return found


@pytest.mark.parametrize("room", sorted(the_code()))
def test_no_room_imports_a_room_below_it_in_the_map(room: str) -> None:
    """Every module and folder, no exception: a room imports itself and the rooms listed above it."""
    order = list(the_map())
    assert room in order, f"{room} is not in the map in afs/__init__.py"
    above = set(order[:order.index(room) + 1])
    for path in _room_files(room):
        upward = sorted(m for m in _afs_imports(path) if m.split(".")[1] not in above)
        assert not upward, f"{path.relative_to(PACKAGE)} imports {upward}, listed below {room}"


# The pure core's rooms, and these files of rooms that are not pure as a whole.
STRATEGISTS = PACKAGE / "brains" / "strategists"
PURE_ELSEWHERE = ["forks/naming.py", "sandbox/demo.py", "brains/gemini/parsing.py",
                  *(str(p.relative_to(PACKAGE)) for p in STRATEGISTS.rglob("*.py"))]
PURE = sorted({str(p.relative_to(PACKAGE)) for room, (section, _) in the_map().items()
               if section == "pure core" for p in _room_files(room)} | set(PURE_ELSEWHERE))
IO_LIBRARIES = {"trio", "psycopg", "mcp", "google", "httpx", "anyio", "subprocess"}
# The one exception: errors.scrub reads a connection string with libpq's own parser
# (psycopg.conninfo: no connection, no I/O), imported where it is used.
PARSERS_ONLY = {"errors.py": ("psycopg", "conninfo")}


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if (node.module, *[a.name for a in node.names]) == PARSERS_ONLY.get(module):
                continue
            imported.add(node.module.split(".")[0])
    assert not imported & IO_LIBRARIES, f"{module} imports {imported & IO_LIBRARIES}"


def test_weights_option_is_checked() -> None:
    assert read_weights(None, "--weights") is None
    assert read_weights("performance=0.6,storage=0.2,complexity=0.1,risk=0.1", "--weights") == {
        "performance": 0.6, "storage": 0.2, "complexity": 0.1, "risk": 0.1}
    for bad in ("performance=0.9,storage=0.2", "performance=x", "performance",
                "performance=0.5,storage=0.2,complexity=0.2,risk=0.2"):
        with pytest.raises(InputError, match="--weights"):
            read_weights(bad, "--weights")
