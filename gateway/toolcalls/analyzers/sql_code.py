"""SQL, read by `sqlglot`: no dialect first, then `postgres`, then `mysql` (the first that
parses wins), every statement's tree walked and matched by expression class.

Choices:
- Unknown is never safe: a statement sqlglot only keeps as a `Command` (CALL, VACUUM,
  REPLACE ...) counts as `writes_files`, its verb in the finding; so does a statement class
  the tables do not list.
- DROP TABLE / VIEW / SCHEMA / DATABASE is `drops_tables` and `deletes`; other DROPs
  (index, function, column ...), DELETE and TRUNCATE are `deletes`.
- Functions that reach past the database (`pg_read_file`, `dblink`, `sys_exec` ...) and
  `COPY ... TO PROGRAM` count for what they reach; `SET GLOBAL` writes the server's
  settings.
- `EXPLAIN ANALYZE <statement>` runs its statement, which is read as SQL one level further
  down.
- `SELECT ... INTO OUTFILE` is not parsed by sqlglot (any dialect) and so is `unparsable`.
- sqlglot logs a warning on its `sqlglot` logger for each statement it keeps only as a
  `Command`: that logger is set to ERROR on import (see below).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from gateway.toolcalls.analyzers.report import (
    DELETES,
    NOTHING,
    READS,
    WRITES,
    Effect,
    Report,
    commands,
    each,
    nested,
)

# sqlglot warns on its own logger for every statement it keeps only as a `Command` (SHOW,
# CALL ...). Clients choose what is analysed, so that is a warning per request, as many as
# they like: a log flood that says nothing the findings do not. Errors still show. The
# level is set once, on import, for the whole process.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

_DIALECTS: Final[tuple[str | None, ...]] = (None, "postgres", "mysql")
_DROPPED_TABLES = frozenset({"TABLE", "VIEW", "SCHEMA", "DATABASE"})

# By expression class (its base classes count: Union is a Query).
_SQL_NODES: Final[Mapping[type[exp.Expr], tuple[Effect, ...]]] = {
    exp.Query: READS,
    exp.Describe: READS,
    exp.Show: READS,
    exp.Delete: DELETES,
    exp.TruncateTable: DELETES,
    exp.Insert: WRITES,
    exp.Update: WRITES,
    exp.Merge: WRITES,
    exp.Create: WRITES,
    exp.Alter: WRITES,
    exp.Grant: WRITES,
    exp.Revoke: WRITES,
    exp.Into: WRITES,  # SELECT ... INTO new_table
    exp.Use: NOTHING,
    exp.Set: NOTHING,
    exp.Transaction: NOTHING,
    exp.Commit: NOTHING,
    exp.Rollback: NOTHING,
}

# Statements sqlglot keeps only as a verb and its text (`Command`); any other verb writes.
_SQL_VERBS: Final[Mapping[str, tuple[Effect, ...]]] = {
    **commands(READS, "SHOW", "DESCRIBE", "DESC", "EXPLAIN"),
    **commands(DELETES, "DROP", "TRUNCATE", "DELETE"),
}

# Functions that reach past the database: the server's files, other hosts, a shell.
_SQL_FUNCTIONS: Final[Mapping[str, Effect]] = {
    **each("reads", "load_file", "pg_read_file", "pg_read_binary_file", "pg_ls_dir",
            "pg_stat_file", "lo_import"),
    **each("writes_files", "pg_file_write", "lo_export"),
    **each("network", "dblink", "dblink_exec", "dblink_connect", "dblink_send_query"),
    **each("spawns_processes", "sys_exec", "sys_eval"),
}  # fmt: skip


def read_sql(code: str, report: Report, depth: int) -> None:
    failure: Exception | None = None
    for dialect in _DIALECTS:
        try:
            statements = sqlglot.parse(code, read=dialect)
        except SqlglotError as exc:  # another dialect may read it
            failure = failure or exc
            continue
        except Exception as exc:  # RecursionError, MemoryError: no dialect is shallower
            report.unparsable("sql", exc)
            return
        for statement in statements:
            if statement is not None:
                _sql_statement(statement, dialect, report, depth)
        return
    report.unparsable("sql", failure or ValueError("no dialect read it"))


def _sql_statement(statement: exp.Expr, dialect: str | None, report: Report, depth: int) -> None:
    handled_apart = exp.Command | exp.Drop | exp.Copy
    if _sql_effects(statement) is None and not isinstance(statement, handled_apart):
        _sql_add(report, "writes_files", statement, dialect)  # a verb nobody listed
    for node in statement.walk():
        if isinstance(node, exp.Drop):
            kind = str(node.args.get("kind") or "").upper()
            if kind in _DROPPED_TABLES:
                _sql_add(report, "drops_tables", node, dialect)
            _sql_add(report, "deletes", node, dialect)
        elif isinstance(node, exp.Command):
            _sql_command(node, dialect, report, depth)
        elif isinstance(node, exp.Copy):
            _sql_copy(node, dialect, report)
        elif isinstance(node, exp.Anonymous):
            if (effect := _SQL_FUNCTIONS.get(node.name.lower())) is not None:
                _sql_add(report, effect, node, dialect)
        elif isinstance(node, exp.SetItem):
            if str(node.args.get("kind") or "").upper() in {"GLOBAL", "PERSIST"}:
                _sql_add(report, "writes_files", node.parent or node, dialect)  # server settings
        elif (effects := _sql_effects(node)) is not None:
            for effect in effects:
                _sql_add(report, effect, node, dialect)
            if isinstance(node, exp.Show) and node.args.get("into_outfile"):
                _sql_add(report, "writes_files", node, dialect)


def _sql_effects(node: exp.Expr) -> tuple[Effect, ...] | None:
    for cls in type(node).__mro__:
        if (effects := _SQL_NODES.get(cls)) is not None:
            return effects
    return None


def _sql_add(report: Report, effect: Effect, node: exp.Expr, dialect: str | None) -> None:
    # Without a dialect sqlglot writes some statements in another one's words (COPY INTO,
    # CREATE TABLE AS for SELECT INTO); postgres's are the closest to what was sent.
    if report.wants(effect):
        report.add(effect, node.sql(dialect=dialect or "postgres"))


def _sql_command(node: exp.Command, dialect: str | None, report: Report, depth: int) -> None:
    verb = str(node.this).upper()
    rest = node.expression  # a string literal, or (DROP USER) a bare string
    rest = rest.name if isinstance(rest, exp.Expr) else str(rest or "")
    for effect in _SQL_VERBS.get(verb, WRITES):
        _sql_add(report, effect, node, dialect)
    if verb == "EXPLAIN" and "ANALYZE" in rest.upper():  # EXPLAIN ANALYZE runs its statement
        first, _, statement = rest.strip().partition(" ")
        if first.upper() == "ANALYZE":
            nested("sql", statement, report, depth)
        else:
            _sql_add(report, "writes_files", node, dialect)


def _sql_copy(node: exp.Copy, dialect: str | None, report: Report) -> None:
    files = node.args.get("files") or []
    names = {f.name.upper() for f in files if isinstance(f, exp.Identifier)}
    _sql_add(report, "reads", node, dialect)
    # FROM writes the table; TO writes a file, unless it streams to the client.
    if node.args.get("kind") or not names & {"STDOUT", "STDIN"}:
        _sql_add(report, "writes_files", node, dialect)
    if "PROGRAM" in names:
        _sql_add(report, "spawns_processes", node, dialect)
