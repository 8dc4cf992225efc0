"""Shell, read by `bashlex` (a port of bash's own grammar): every command it would run,
matched by its command word against tables of names.

Choices:
- Unknown is never safe: a command word the tables do not know counts as
  `spawns_processes` (running a program nobody listed is running a process).
- Every command is classified, also those in pipelines, lists, subshells, `$(...)`,
  backticks, `<(...)`, functions, loops and conditionals, after wrappers (`sudo`, `env
  VAR=1`, `nohup`, `time`, `timeout`, `nice`, `xargs`, `exec`) are peeled off. Known
  read-only commands (cat, ls, grep ...) are `reads`; builtins that only change the shell
  itself (echo, cd, export ...) are nothing. Output redirections write unless their target
  is /dev/null, /dev/stdout or /dev/stderr; `&` spawns.
- Code inside code: `bash -c '...'`, `sh -c`, `su -c` and `eval` are read as shell,
  `python -c` as Python, `find -exec`'s command as a command, `$(...)` inside `${...}`
  as shell.
- `awk` and `sed` programs are not looked into (their `system()` and `w` commands are not
  seen).
- Shell longer than MAX_SHELL_CHARS (4,000) is `unparsable` without parsing, wherever it is
  found (a Python `os.system("...")` too): bashlex is the slowest of the three parsers.
- bashlex does not parse `[[ ]]`, `case`, the `time` keyword, arithmetic `$(( ))` or
  quoted here-document delimiters (`<<'EOF'`, idank/bashlex#99): those are `unparsable`,
  as is a command substitution inside a here-document's text, which bash runs but bashlex
  leaves as text. Its quote removal slips on mixed quoting (`'a'"'"'b'`): such a word is
  read again by `shlex`. It scans a word with an unclosed `${` forever (`l'${'`): that is
  refused as the bad substitution it is (see `_refuse_bashlex_rescans`).
- bashlex parses through one module-level ply parser that keeps its stacks on itself, so
  shell parses are serialised by a lock.
"""

from __future__ import annotations

import functools
import posixpath
import shlex
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import bashlex
import bashlex.errors
import bashlex.subst

from gateway.toolcalls.analyzers.report import (
    DELETES,
    MAX_NESTING,
    NETWORK,
    NOTHING,
    READS,
    SPAWNS,
    WRITES,
    Effect,
    Report,
    commands,
    nested,
)

# bashlex's cost grows with the code's length; this bounds one parse on the event loop
# (the package docstring has the measured worst case).
MAX_SHELL_CHARS = 4_000

# bashlex parses through one module-level yacc object that holds the parse's state.
_BASHLEX_LOCK = threading.Lock()


def _refuse_bashlex_rescans() -> None:
    """bashlex 0.18 loops forever, its memory growing, on a word with a `${` and no `}`
    after it (`l'${'`): `subst._paramexpand` answers index 0 and the word's scanner starts
    the word over. Wrapped here, that answer is the bad substitution it is, raised as
    bashlex's own ParsingError; every other answer passes unchanged. The wrap is made once,
    on import, for the whole process: it changes bashlex only where bashlex would never
    return. With it, 300,000 random inputs (metacharacters, quotes, expansions,
    here-documents) parse or fail in time; without it, about one in 3,000 hung."""
    original = bashlex.subst._paramexpand
    if hasattr(original, "__wrapped__"):  # already wrapped (a reload)
        return

    @functools.wraps(original)
    def paramexpand(parser: Any, string: str, start: int) -> tuple[Any, int]:
        node, end = original(parser, string, start)
        if end <= start:
            raise bashlex.errors.ParsingError("bad substitution: no closing }", string, start)
        return node, end

    bashlex.subst._paramexpand = paramexpand


_refuse_bashlex_rescans()

# By the command word's basename. A word not here (nor a handler below) spawns a process.
_SHELL_COMMANDS: Final[Mapping[str, tuple[Effect, ...]]] = {
    # builtins and printers that change nothing outside the shell itself
    **commands(
        NOTHING,
        "echo", "printf", "true", "false", ":", "test", "[", "cd", "pushd", "popd", "export",
        "unset", "set", "alias", "unalias", "local", "declare", "typeset", "readonly", "shift",
        "exit", "return", "wait", "sleep", "read", "break", "continue", "umask", "shopt",
        "seq", "expr", "basename", "dirname",
    ),
    **commands(
        READS,
        "cat", "tac", "less", "more", "head", "tail", "ls", "dir", "grep", "egrep", "fgrep",
        "rg", "ag", "ack", "wc", "stat", "file", "du", "df", "pwd", "which", "whereis", "type",
        "whoami", "id", "groups", "date", "uname", "hostname", "uptime", "ps", "free",
        "printenv", "tree", "diff", "cmp", "comm", "sort", "uniq", "cut", "tr", "paste",
        "join", "column", "fold", "nl", "od", "xxd", "hexdump", "strings", "md5sum",
        "sha1sum", "sha256sum", "sha512sum", "cksum", "base64", "jq", "yq", "awk", "gawk",
        "mawk", "realpath", "readlink", "locate", "lsof", "netstat", "ss", "history", "man",
    ),
    **commands(
        WRITES,
        "cp", "mv", "dd", "install", "mkdir", "touch", "chmod", "chown", "chgrp", "ln", "tee",
        "tar", "zip", "unzip", "gzip", "gunzip", "bzip2", "xz", "patch", "split", "mktemp",
        "mkfifo", "rename",
    ),
    **commands(DELETES, "rm", "rmdir", "shred", "unlink", "truncate", "wipefs", "mkfs"),
    **commands(
        NETWORK,
        "nc", "ncat", "netcat", "ssh", "sftp", "ftp", "telnet", "ping", "dig", "nslookup",
        "host", "traceroute", "whois", "socat",
    ),
    **commands(("network", "writes_files"), "wget", "scp"),
    **commands(
        SPAWNS,
        "kill", "pkill", "killall", "source", ".", "node", "perl", "ruby", "php", "deno",
        "bun", "lua", "Rscript", "crontab", "at", "reboot", "shutdown", "systemctl",
    ),
}  # fmt: skip

_QUIET_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_OUTPUT_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})


@dataclass(frozen=True)
class _Wrapper:
    """A command that runs the command after it: `sudo -u bob rm x` is `rm x`, as bob."""

    effect: Effect | None = None
    valued: frozenset[str] = frozenset()  # its options that take the next word
    operands: int = 0  # words before the wrapped command (timeout's duration)
    assignments: bool = False  # env's VAR=value words


_WRAPPERS: Final[Mapping[str, _Wrapper]] = {
    "sudo": _Wrapper(
        "spawns_processes",
        frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user",
                   "--group", "--chdir", "--host", "--prompt", "--role", "--type"}),
    ),
    "doas": _Wrapper("spawns_processes", frozenset({"-u", "-C"})),
    "nohup": _Wrapper("spawns_processes"),
    "setsid": _Wrapper("spawns_processes"),
    "exec": _Wrapper("spawns_processes", frozenset({"-a"})),
    "xargs": _Wrapper(
        "spawns_processes",
        frozenset({"-I", "-i", "-n", "-P", "-L", "-l", "-s", "-d", "-E", "-e", "-a",
                   "--max-args", "--max-procs", "--max-lines", "--delimiter", "--arg-file"}),
    ),
    "env": _Wrapper(None, frozenset({"-u", "-C", "--unset", "--chdir"}), assignments=True),
    "time": _Wrapper(None, frozenset({"-f", "-o", "--format", "--output"})),
    "nice": _Wrapper(None, frozenset({"-n", "--adjustment"})),
    "ionice": _Wrapper(None, frozenset({"-c", "-n", "-p", "--class", "--classdata"})),
    "stdbuf": _Wrapper(None, frozenset({"-i", "-o", "-e"})),
    "timeout": _Wrapper(None, frozenset({"-s", "-k", "--signal", "--kill-after"}), operands=1),
    "command": _Wrapper(),
    "builtin": _Wrapper(),
}  # fmt: skip

_FIND_WRITES = frozenset({"-fprint", "-fprint0", "-fprintf", "-fls"})
_FIND_RUNS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})

_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "mksh", "fish", "su"})

_GIT: Final[Mapping[str, tuple[Effect, ...]]] = {
    **commands(
        READS,
        "status", "log", "diff", "show", "blame", "grep", "ls-files", "rev-parse", "describe",
        "shortlog", "reflog", "cat-file", "", "help", "version",
    ),
    **commands(DELETES, "clean", "rm"),
    **commands(("network", "writes_files"), "clone", "fetch", "pull", "submodule"),
    **commands(NETWORK, "push", "ls-remote"),
}  # fmt: skip
_GIT_VALUED = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace"})

_PACKAGE_MANAGERS = frozenset({
    "pip", "pip3", "npm", "pnpm", "yarn", "uv", "gem", "cargo", "apt", "apt-get", "brew",
    "conda", "poetry", "go",
})  # fmt: skip
_PACKAGE_VERBS: Final[Mapping[str, tuple[Effect, ...]]] = {
    **commands(
        ("network", "writes_files"),
        "install", "i", "add", "update", "upgrade", "download", "sync", "ci", "get", "lock",
    ),
    **commands(DELETES, "uninstall", "remove", "rm", "purge", "autoremove"),
    **commands(READS, "list", "show", "freeze", "info", "view", "outdated", "check", "ls"),
}  # fmt: skip


def read_shell(code: str, report: Report, depth: int) -> None:
    if len(code) > MAX_SHELL_CHARS:  # also shell inside Python: os.system("...")
        report.add("unparsable", f"shell longer than {MAX_SHELL_CHARS} characters: not parsed")
        return
    try:
        with _BASHLEX_LOCK:
            trees: list[Any] = list(bashlex.parse(code))
    except Exception as exc:  # ParsingError, NotImplementedError, RecursionError, its bugs
        report.unparsable("shell", exc)
        return
    pending = list(reversed(trees))
    while pending:  # a loop, not recursion: nesting is as deep as the input makes it
        node = pending.pop()
        kind = node.kind
        if kind == "command":
            words = [_shell_word(code, part) for part in node.parts if part.kind == "word"]
            read_command(words, report, depth)
        elif kind == "redirect":
            _shell_redirect(node, report)
        elif kind == "operator" and node.op == "&":
            report.add("spawns_processes", "& runs a command in the background")
        elif kind == "parameter":
            _shell_parameter(str(getattr(node, "value", "")), report, depth)
        elif kind == "heredoc" and ("$(" in str(node.value) or "`" in str(node.value)):
            report.add("unparsable", "a here-document runs a command substitution: not parsed")
        pending.extend(reversed(list(_shell_children(node))))


def _shell_word(code: str, node: Any) -> str:
    word = str(node.word)
    if "'" not in word and '"' not in word:
        return word
    # bashlex's quote removal slips on mixed quoting (`'a'"'"'b'`, which is how shlex.quote
    # quotes a quote): a word that still holds one is read again by the standard library.
    start, end = node.pos
    try:
        words = shlex.split(code[start:end])
    except ValueError:
        return word
    return words[0] if len(words) == 1 else word


def _shell_children(node: Any) -> Iterator[Any]:
    for value in vars(node).values():
        if isinstance(value, bashlex.ast.node):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if isinstance(item, bashlex.ast.node))


def _shell_redirect(node: Any, report: Report) -> None:
    target = node.output
    if not isinstance(target, bashlex.ast.node):  # 2>&1, >&2: a file descriptor, no file
        return
    if node.type in _OUTPUT_REDIRECTS and target.word not in _QUIET_TARGETS:
        report.add("writes_files", f"{node.type} {target.word}")
    elif node.type == "<":
        report.add("reads", f"< {target.word}")


def _shell_parameter(value: str, report: Report, depth: int) -> None:
    # bashlex keeps `${x:-$(cmd)}` as text; bash runs cmd. The operand is a word, which
    # bashlex does parse after a no-op command.
    if "$(" in value or "`" in value or "<(" in value or ">(" in value:
        nested("shell", f": {value}", report, depth)


def read_command(words: list[str], report: Report, depth: int) -> None:
    """One command's words, after its wrappers (sudo, env, nohup ...), by its command word."""
    text = " ".join(words)
    at = 0
    while at < len(words) and (wrapper := _WRAPPERS.get(posixpath.basename(words[at]))):
        if wrapper.effect is not None:
            report.add(wrapper.effect, text)
        at = _past_wrapper(words, at + 1, wrapper)
    if at >= len(words):
        return
    name = posixpath.basename(words[at])
    args = words[at + 1 :]
    if name.startswith("mkfs."):
        name = "mkfs"
    if (handler := _SHELL_HANDLERS.get(name)) is not None:
        handler(args, report, depth, text)
    elif _is_python(name):
        _shell_python(args, report, depth, text)
    else:
        for effect in _SHELL_COMMANDS.get(name, SPAWNS):
            report.add(effect, text)


def _past_wrapper(words: list[str], at: int, wrapper: _Wrapper) -> int:
    operands = wrapper.operands
    while at < len(words):
        word = words[at]
        if word == "--":
            return at + 1
        option = word.startswith("-") and len(word) > 1
        if word in wrapper.valued:
            at += 2
        elif option or (wrapper.assignments and "=" in word):
            at += 1
        elif operands:
            operands -= 1
            at += 1
        else:
            break
    return at


def _code_argument(args: list[str]) -> str | None:
    """The code of `sh -c CODE`, `bash -lc CODE`, `su -c CODE`, `python -c CODE`."""
    for at, arg in enumerate(args):
        if arg.startswith("--command="):
            return arg.partition("=")[2]
        flag = arg == "--command" or (
            arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]
        )
        if flag:
            return args[at + 1] if at + 1 < len(args) else None
    return None


def _shell_shell(args: list[str], report: Report, depth: int, text: str) -> None:
    report.add("spawns_processes", text)
    if (code := _code_argument(args)) is not None:
        nested("shell", code, report, depth)


def _is_python(name: str) -> bool:
    """python, python3, python3.11, pypy3: whichever version a script names."""
    for prefix in ("python", "pypy"):
        if name.startswith(prefix):
            version = name.removeprefix(prefix)
            return not version or version.replace(".", "").isdigit()
    return False


def _shell_python(args: list[str], report: Report, depth: int, text: str) -> None:
    report.add("spawns_processes", text)
    if "-m" in args:  # python -m pip install ...: pip's own verbs
        module = args.index("-m") + 1
        if args[module : module + 1] == ["pip"]:
            _shell_packages(args[module + 1 :], report, depth, text)
    elif (code := _code_argument(args)) is not None:
        nested("python", code, report, depth)


def _shell_eval(args: list[str], report: Report, depth: int, text: str) -> None:
    report.add("spawns_processes", text)
    nested("shell", " ".join(args), report, depth)


def _shell_find(args: list[str], report: Report, depth: int, text: str) -> None:
    if not (_FIND_WRITES | _FIND_RUNS | {"-delete"}) & set(args):
        report.add("reads", text)
    for at, arg in enumerate(args):
        if arg == "-delete":
            report.add("deletes", text)
        elif arg in _FIND_WRITES:
            report.add("writes_files", text)
        elif arg in _FIND_RUNS:
            report.add("spawns_processes", text)
            end = next((i for i in range(at + 1, len(args)) if args[i] in {";", "+"}), len(args))
            if depth >= MAX_NESTING:
                report.add("unparsable", f"find -exec nested more than {MAX_NESTING} deep")
            else:
                read_command(args[at + 1 : end], report, depth + 1)


def _shell_git(args: list[str], report: Report, depth: int, text: str) -> None:
    at = 0
    while at < len(args) and args[at].startswith("-"):
        at += 2 if args[at] in _GIT_VALUED else 1
    verb = args[at] if at < len(args) else ""
    effects = _GIT.get(verb, WRITES)
    if verb in {"reset", "checkout", "restore"} and ("--hard" in args or "--" in args):
        effects = DELETES  # discards uncommitted work
    for effect in effects:
        report.add(effect, text)


def _shell_sed(args: list[str], report: Report, depth: int, text: str) -> None:
    in_place = any(
        arg == "--in-place"
        or arg.startswith("--in-place=")
        or (arg.startswith("-") and not arg.startswith("--") and "i" in arg[1:])
        for arg in args
    )
    report.add("writes_files" if in_place else "reads", text)


def _shell_rsync(args: list[str], report: Report, depth: int, text: str) -> None:
    report.add("writes_files", text)
    operands = [arg for arg in args if not arg.startswith("-")]
    if any(_remote_path(arg) for arg in operands):
        report.add("network", text)
    if any(arg.startswith(("--delete", "--remove-source-files")) for arg in args):
        report.add("deletes", text)


def _remote_path(arg: str) -> bool:
    """rsync's `host:path`, `user@host:path` and `rsync://host/path`."""
    if arg.startswith("rsync://"):
        return True
    host, colon, _ = arg.partition(":")
    return bool(colon) and bool(host) and "/" not in host


def _shell_curl(args: list[str], report: Report, depth: int, text: str) -> None:
    report.add("network", text)
    saves = any(
        arg in {"--output", "--remote-name", "--remote-name-all", "--output-dir"}
        or (arg.startswith("-") and not arg.startswith("--") and ("o" in arg or "O" in arg))
        for arg in args
    )
    if saves:
        report.add("writes_files", text)


def _shell_packages(args: list[str], report: Report, depth: int, text: str) -> None:
    verbs = [arg for arg in args if not arg.startswith("-")]
    if verbs[:1] == ["pip"]:  # uv pip install
        verbs = verbs[1:]
    for effect in _PACKAGE_VERBS.get(verbs[0] if verbs else "", SPAWNS):
        report.add(effect, text)


_ShellHandler = Callable[[list[str], Report, int, str], None]
_SHELL_HANDLERS: Final[Mapping[str, _ShellHandler]] = {
    **dict.fromkeys(_SHELLS, _shell_shell),
    **dict.fromkeys(_PACKAGE_MANAGERS, _shell_packages),
    "eval": _shell_eval,
    "find": _shell_find,
    "git": _shell_git,
    "sed": _shell_sed,
    "rsync": _shell_rsync,
    "curl": _shell_curl,
}
