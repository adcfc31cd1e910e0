#!/usr/bin/env bash
# The peer of benchmarks/quality.py: postgres-mcp (from PyPI), whose index tuning needs HypoPG.
#
#   benchmarks/peer_setup.sh [VENV]      (default VENV: $AFS_PEER_VENV or ~/.cache/afs-peer/venv)
#
# As root: `apt-get update` once (a marker file remembers it), then Debian's PostgreSQL and its
# HypoPG package of the same major version (postgresql, postgresql-NN-hypopg, postgresql-contrib).
# Then postgres-mcp in a virtualenv of its own (it needs Python >= 3.12 and pins its own pglast:
# it never goes into AFS's environment). postgres-mcp pins pglast==7.2.0; when the registry does
# not offer that version, the nearest 7.x (the same parser, PostgreSQL 17) is installed instead;
# mcp stays below 2 (postgres-mcp 0.3 imports FastMCP, which mcp 2 renamed).
#
# Prints one last line: "ok VENV PG_BINDIR" or "cannot run: <reason>"; exits 0 either way, so a
# machine without apt or without a new enough Python still runs the quality benchmark (its peer
# column then says why not).
set -u
VENV="${1:-${AFS_PEER_VENV:-$HOME/.cache/afs-peer/venv}}"
MARKER="$(dirname "$VENV")/apt-updated"
PEER_VERSION="${AFS_PEER_VERSION:-0.3.0}"

cannot() { echo "cannot run: $*"; exit 0; }
log() { echo "[peer_setup] $*" >&2; }

pg_bindir() {  # the newest Debian PostgreSQL whose HypoPG extension is installed
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
    local major; major="$(basename "$(dirname "$dir")")"
    if [ -x "$dir/initdb" ] && [ -f "/usr/share/postgresql/$major/extension/hypopg.control" ]; then
      echo "$dir"; return 0
    fi
  done
  return 1
}

mkdir -p "$(dirname "$VENV")" || cannot "cannot create $(dirname "$VENV")"
if ! BINDIR="$(pg_bindir)"; then
  [ "$(id -u)" = 0 ] || cannot "Debian's PostgreSQL with HypoPG is not installed and this is not root"
  command -v apt-get >/dev/null || cannot "no apt-get: Debian's PostgreSQL with HypoPG cannot be installed"
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -f "$MARKER" ]; then
    log "apt-get update"
    apt-get -o DPkg::Lock::Timeout=600 update -q >&2 || cannot "apt-get update failed"
    touch "$MARKER"
  fi
  major="$(apt-cache depends postgresql 2>/dev/null | sed -n 's/.*Depends: postgresql-\([0-9][0-9]*\)$/\1/p' | head -1)"
  [ -n "$major" ] || cannot "apt knows no postgresql package"
  log "apt-get install postgresql-$major postgresql-$major-hypopg postgresql-contrib"
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
    "postgresql-$major" "postgresql-$major-hypopg" postgresql-contrib >&2 \
    || cannot "apt-get install postgresql-$major-hypopg failed"
  BINDIR="$(pg_bindir)" || cannot "postgresql-$major-hypopg installed, but no hypopg.control found"
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import postgres_mcp.index.dta_calc" 2>/dev/null; then
  PY=""
  for candidate in python3.13 python3.12 $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -r); do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      PY="$(command -v "$candidate")"; break
    fi
  done
  [ -n "$PY" ] || cannot "postgres-mcp needs Python >= 3.12 and none is installed"
  log "postgres-mcp $PEER_VERSION into $VENV (with $PY)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2 || cannot "$PY -m venv failed"
  PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
  # mcp 2 renamed FastMCP, which postgres-mcp 0.3 imports: mcp stays below 2
  if ! "${PIP[@]}" "postgres-mcp==$PEER_VERSION" "mcp[cli]>=1.5.0,<2" >&2; then
    log "postgres-mcp's pinned dependencies are not all available; its pglast pin relaxed to 7.x"
    "${PIP[@]}" --no-deps "postgres-mcp==$PEER_VERSION" >&2 || cannot "pip install postgres-mcp failed"
    "${PIP[@]}" "pglast>=7.2,<8" "attrs>=25.3.0" "humanize>=4.8.0" "instructor>=1.7.9" "mcp[cli]>=1.5.0,<2" \
      "psycopg-pool>=3.2.6" "psycopg[binary]>=3.2.6" >&2 || cannot "pip install of postgres-mcp's dependencies failed"
  fi
  "$VENV/bin/python" -c "import postgres_mcp.index.dta_calc" >&2 || cannot "postgres-mcp does not import"
fi
echo "ok $VENV $BINDIR"
