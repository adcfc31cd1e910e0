"""Functions judged by name alone (pure): those with side effects (`DENIED_FUNCTIONS` and the
patterns of the system's prefixes) and those that read what a statement does not name
(`READS_UNNAMED`). Before the catalog is asked, only the exact names and the patterns of the
pg_ and binary_upgrade_ prefixes are refused (`_denied_by_name`); the catalog then tells a
built-in from a user's own function of the same name (`afs.safety.references`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

DENIED_FUNCTIONS: frozenset[str] = frozenset({
    # sleeping: not a query worth optimizing, and it holds a fork's benchmark slot
    "pg_sleep", "pg_sleep_for", "pg_sleep_until",
    # other backends, server configuration and logs
    "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "pg_rotate_logfile",
    "pg_rotate_logfile_old", "set_config", "pg_log_backend_memory_contexts", "pg_log_standby_snapshot",
    # server files
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_logdir_ls",
    # large objects
    "loread", "lowrite",
    # sequences
    "nextval", "setval",
    # notifications
    "pg_notify",
    # WAL, backups, recovery, replication
    "pg_switch_wal", "pg_switch_xlog", "pg_promote", "pg_logical_emit_message",
    "pg_create_restore_point", "pg_start_backup", "pg_stop_backup", "pg_backup_start",
    "pg_backup_stop", "pg_wal_replay_pause", "pg_wal_replay_resume", "pg_xlog_replay_pause",
    "pg_xlog_replay_resume",
    # functions that run SQL given as text
    "query_to_xml", "query_to_xmlschema", "query_to_xml_and_xmlschema", "cursor_to_xml",
    "cursor_to_xmlschema", "ts_stat", "ts_rewrite", "connectby", "xpath_table",
    # statistics and caches the benchmark relies on
    "pg_stat_statements_reset", "pg_prewarm", "autoprewarm_start_worker", "autoprewarm_dump_now",
    "pg_truncate_visibility_map",
    # index maintenance functions that write
    "gin_clean_pending_list", "brin_summarize_new_values", "brin_summarize_range",
    "brin_desummarize_range",
    # catalog writes
    "pg_import_system_collations", "pg_extension_config_dump",
    # the best-known names the patterns below cover outside the pg_ prefix (large objects,
    # dblink, tablefunc, pgsql-http), refused before any catalog is asked
    "lo_import", "lo_export", "lo_unlink", "lo_put", "lo_create", "lo_creat", "lo_from_bytea", "lo_open",
    "lo_truncate", "lo_truncate64", "lo_manage", "dblink", "dblink_exec", "dblink_connect",
    "dblink_connect_u", "dblink_send_query", "dblink_open", "dblink_fetch", "crosstab", "crosstab2",
    "crosstab3", "crosstab4", "http", "http_get", "http_post", "http_put", "http_delete", "http_patch",
    "http_head",
})


# Built-ins that read what the query does not name: relations named as text (the *_to_xml family,
# which `check_query` and the relation checks never see) and other sessions' activity, locks and
# memory. Refused wherever PostgreSQL resolves them (a call, a view, attribute notation), like
# DENIED_FUNCTIONS; the patterns below cover their siblings.
READS_UNNAMED: frozenset[str] = frozenset({
    "table_to_xml", "table_to_xmlschema", "table_to_xml_and_xmlschema", "schema_to_xml",
    "schema_to_xmlschema", "schema_to_xml_and_xmlschema", "database_to_xml", "database_to_xmlschema",
    "database_to_xml_and_xmlschema", "pg_stat_get_activity", "pg_stat_get_progress_info",
    "pg_blocking_pids", "pg_safe_snapshot_blocking_pids", "pg_lock_status", "pg_prepared_xact",
    "pg_get_backend_memory_contexts", "pg_stat_get_wal_senders", "pg_stat_get_wal_receiver",
    "pg_stat_get_subscription",
})


_READS_UNNAMED_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"^(table|schema|database|query|cursor)_to_xml",  # reads a relation, schema or query named as text
    r"^pg_stat_get_backend_",  # another backend's query, user, client address, …
))


_DENIED_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"^dblink",  # dblink, dblink_exec, dblink_connect, …
    r"^pg_(try_)?advisory_",  # advisory locks
    r"^lo_",  # lo_import, lo_export, lo_unlink, lo_put, …
    r"^pg_read_", r"^pg_ls_", r"^pg_file_",  # server files (core and adminpack)
    r"replication_slot", r"^pg_logical_slot_", r"^pg_replication_origin_",
    r"^crosstab",  # tablefunc: runs SQL given as text
    r"^pg_stat_reset", r"^pg_\w*_reset$",  # pg_stat_reset_shared, pg_stat_statements_reset, …
    r"^pg_(restore|clear)_\w*_stats$",  # planner statistics (PostgreSQL 18)
    r"^pg_buffercache_evict",  # empties shared buffers (PostgreSQL 17, 18)
    r"^binary_upgrade_",
    r"^pg_background_",  # runs SQL in a background worker
    r"^http(_|$)",  # pgsql-http, pg_net: network requests
))


def denied_function(funcname: Sequence[str]) -> bool:
    """True when a built-in or extension function, named by its (possibly schema-qualified)
    parts, has side effects. Only meaningful for a function the catalog says is built in (or
    comes from an allowed extension): a user's own function is refused whatever its name.
    """
    if not funcname:
        return False
    name = funcname[-1].lower()
    return (name in DENIED_FUNCTIONS or any(p.search(name) for p in _DENIED_PATTERNS)
            or reads_unnamed(funcname))


def reads_unnamed(funcname: Sequence[str]) -> bool:
    """True when a built-in, named by its (possibly qualified) parts, reads relations named as
    text or other sessions' activity (`READS_UNNAMED`)."""
    name = funcname[-1].lower() if funcname else ""
    return name in READS_UNNAMED or any(p.search(name) for p in _READS_UNNAMED_PATTERNS)


def _denied_by_name(funcname: Sequence[str]) -> bool:
    """`denied_function` before the catalog is asked: the exact names, and the patterns of the
    system's own prefixes (pg_, binary_upgrade_). A user's own lo_total() or http_status() is
    not refused for its name (the catalog refuses it for being defined in the database)."""
    if not funcname:
        return False
    name = funcname[-1].lower()
    system_prefix = name.startswith(("pg_", "binary_upgrade_"))
    return (name in DENIED_FUNCTIONS or name in READS_UNNAMED
            or (system_prefix and denied_function(funcname)))


def _denial(funcname: Sequence[str]) -> str:
    """Why a denied function is refused, as the end of a sentence."""
    if reads_unnamed(funcname):
        return "reads relations named as text or other sessions' activity"
    return "has side effects"
