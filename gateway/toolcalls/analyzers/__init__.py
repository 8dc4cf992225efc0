"""What a code-carrying tool-call argument would do, read by a real parser for its language.

An agent's tool names say little: `run`, `execute` or `query` may list a folder or wipe a
disk. The policy decides allow / deny / hold for a person by what a call does, so this
package turns the code inside an argument into effects, deterministically and without
running anything:

    reads              reads files or data and changes nothing
    writes_files       writes files; for SQL, writes data (INSERT, UPDATE, CREATE, GRANT...)
    deletes            deletes files or rows (rm, os.remove, DELETE, TRUNCATE, DROP ...)
    spawns_processes   runs a process or arbitrary code (subprocess, eval, sudo, `&`, sh)
    network            talks to another host (curl, ssh, requests, dblink, pip install)
    drops_tables       drops a table, view, schema or database
    unparsable         some or all of it could not be read: the effects may be incomplete

Each language is read by a parser people trust, never by one written here: Python by the
standard library's `ast` (python_code.py), shell by `bashlex`, a port of bash's own grammar
(shell_code.py), SQL by `sqlglot` (sql_code.py). The parser's tree is matched against
tables of names -> effects; nothing is guessed from the text. Each module's docstring has
its language's choices; report.py has what they share (the findings, code inside code).

Unknown is never safe. A shell command word the tables do not know counts as
`spawns_processes`; an SQL statement sqlglot only keeps as a `Command` counts as
`writes_files`. A parse failure, a RecursionError or MemoryError, code longer than
MAX_CODE_CHARS, or shell longer than MAX_SHELL_CHARS is `unparsable`, never an empty set.

Code inside code is read too, at most MAX_NESTING (3) levels down: `bash -c '...'`,
`sh -c`, `su -c`, `eval`, `python -c`, `find -exec`, `$(...)` inside `${...}`,
`os.system("...")` and `subprocess.run([...])` with literal arguments, `EXPLAIN ANALYZE
<statement>` (which runs it). Deeper nesting adds `unparsable`.

Findings are short reasons for a person who decides (`shutil.rmtree(...) deletes files`,
`rm -rf /`, `DROP TABLE users`): at most 8, each at most 120 characters, control
characters escaped, at least one for every effect found.

Cost per call, measured on 10-12 typical snippets per language (under 300 characters,
2 CPU cores): median about 0.07 ms for Python, 0.3 ms for shell, 0.3-0.4 ms for SQL. The
caps bound the worst case: 4,000 characters of pathological shell (2,000 one-letter
commands, one a line) take about 0.2 s, nearly all of it inside bashlex (20,000 took 1 to
1.5 s: hence shell's lower cap), and 20,000 characters of SQL about 0.5 s. Shell parses
are serialised by a lock (see shell_code.py).
"""

from __future__ import annotations

from gateway.toolcalls.analyzers.python_code import read_python
from gateway.toolcalls.analyzers.report import (
    EFFECTS,
    MAX_FINDING_CHARS,
    MAX_FINDINGS,
    MAX_NESTING,
    READERS,
    Analysis,
    Effect,
    Language,
    Report,
    unparsable,
    why,
)
from gateway.toolcalls.analyzers.shell_code import MAX_SHELL_CHARS, read_shell
from gateway.toolcalls.analyzers.sql_code import read_sql

__all__ = [
    "EFFECTS",
    "MAX_CODE_CHARS",
    "MAX_FINDINGS",
    "MAX_FINDING_CHARS",
    "MAX_NESTING",
    "MAX_SHELL_CHARS",
    "Analysis",
    "Effect",
    "Language",
    "analyze",
]

MAX_CODE_CHARS = 20_000

# Code inside code is handed to its language's reader through this registry (report.py).
READERS.update({"python": read_python, "shell": read_shell, "sql": read_sql})


def analyze(language: Language, code: str) -> Analysis:
    """What `code` in `language` would do. Never raises: whatever cannot be read is
    `unparsable`, with a finding saying why."""
    if not isinstance(code, str):
        return unparsable("the code is not text")
    if len(code) > MAX_CODE_CHARS:
        return unparsable(f"longer than {MAX_CODE_CHARS} characters: not parsed")
    if not isinstance(language, str) or language not in READERS:
        return unparsable(f"unknown language {language!r}")
    if not code.strip():
        return Analysis(frozenset(), ())
    report = Report()
    try:
        READERS[language](code, report, 0)
    except Exception as exc:  # the tree is walked by hand, too: RecursionError, MemoryError
        return unparsable(f"{language} not analysed: {why(exc)}")
    return report.analysis()
