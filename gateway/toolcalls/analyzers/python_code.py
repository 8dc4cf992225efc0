"""Python, read by the standard library's `ast`: the calls and imports it makes, matched
against tables of qualified names.

Choices:
- Calls and imports are resolved through `import x as y` / `from x import y as z` (and
  `from x import *`), flat over the module: a name bound anywhere counts everywhere.
- Importing a network module, `subprocess` or `multiprocessing` counts as using it.
- Method names that only paths have (`.unlink()`, `.write_text()` ...) count whatever the
  receiver.
- `eval`, `exec`, `compile` and `__import__` are `spawns_processes`: they run code nobody
  can read here. Reflection (`getattr(os, name)`) is not followed.
- `os.system("...")` and `subprocess.run([...])` with literal arguments are read as shell
  too (a string by the shell reader, one level further down; a list as one command's words).
- A Markdown fence around the code (```python ... ```) is stripped first.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Mapping
from typing import Final

from gateway.toolcalls.analyzers.report import Effect, Report, each, nested
from gateway.toolcalls.analyzers.shell_code import read_command

_PY_PHRASES: Final[Mapping[Effect, str]] = {
    "reads": "reads files",
    "writes_files": "writes files",
    "deletes": "deletes files",
    "spawns_processes": "runs a process or arbitrary code",
    "network": "uses the network",
}

# Qualified names, as the module that defines them spells them.
_PY_CALLS: Final[Mapping[str, Effect]] = {
    **each(
        "deletes",
        "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.truncate", "shutil.rmtree",
    ),
    **each(
        "writes_files",
        "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.copymode",
        "shutil.copystat", "shutil.move", "shutil.chown", "shutil.make_archive",
        "shutil.unpack_archive", "os.rename", "os.renames", "os.replace", "os.makedirs",
        "os.mkdir", "os.mkfifo", "os.chmod", "os.chown", "os.lchown", "os.symlink", "os.link",
        "os.utime", "os.open", "tempfile.mkstemp", "tempfile.mkdtemp",
        "tempfile.NamedTemporaryFile", "tempfile.TemporaryFile", "tempfile.TemporaryDirectory",
    ),
    **each(
        "spawns_processes",
        "os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg",
        "os.startfile", "os.posix_spawn", "os.posix_spawnp",
        "os.execl", "os.execle", "os.execlp", "os.execlpe",
        "os.execv", "os.execve", "os.execvp", "os.execvpe",
        "os.spawnl", "os.spawnle", "os.spawnlp", "os.spawnlpe",
        "os.spawnv", "os.spawnve", "os.spawnvp", "os.spawnvpe",
        "pty.spawn", "pty.fork", "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell", "concurrent.futures.ProcessPoolExecutor",
        "eval", "exec", "compile", "__import__", "importlib.import_module",
        "runpy.run_path", "runpy.run_module",
    ),
    **each("network", "asyncio.open_connection", "asyncio.start_server"),
    **each(
        "reads",
        "os.listdir", "os.scandir", "os.walk", "os.fwalk", "glob.glob", "glob.iglob",
    ),
}  # fmt: skip

# Modules whose every use (an import included) has the effect: a prefix of a name matches.
_PY_MODULES: Final[Mapping[str, Effect]] = {
    **each("spawns_processes", "subprocess", "multiprocessing"),
    **each(
        "network",
        "socket", "urllib.request", "urllib3", "http.client", "requests", "httpx", "aiohttp",
        "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "paramiko", "asyncssh",
        "websocket", "websockets", "xmlrpc.client", "pycurl", "boto3",
    ),
}  # fmt: skip

# Method names only paths (or URL openers) have: they count whatever the receiver is.
_PY_METHODS: Final[Mapping[str, Effect]] = {
    **each("deletes", "unlink", "rmdir"),
    **each("writes_files", "write_text", "write_bytes", "mkdir", "touch", "symlink_to",
            "hardlink_to"),
    **each("reads", "read_text", "read_bytes", "iterdir", "glob", "rglob"),
    **each("network", "urlopen"),
}  # fmt: skip

# Callables with open()'s signature: where their mode argument is.
_PY_OPENERS: Final[Mapping[str, int]] = {
    "open": 1, "io.open": 1, "codecs.open": 1, "gzip.open": 1, "bz2.open": 1, "lzma.open": 1,
    "os.fdopen": 1,
}  # fmt: skip
_MODE_CHARACTERS = frozenset("rwxabt+U")

# Calls whose first argument is a command line: a literal one is read as shell.
_PY_SHELL_RUNNERS: Final[frozenset[str]] = frozenset({
    "os.system", "os.popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput",
    "subprocess.getstatusoutput",
})  # fmt: skip
_PY_KNOWN: Final[frozenset[str]] = frozenset({*_PY_CALLS, *_PY_OPENERS, *_PY_SHELL_RUNNERS})


def read_python(code: str, report: Report, depth: int) -> None:
    try:
        # The compiler warns about code (`"\d"`, `1if x else 2`) and, where warnings are
        # errors, refuses it: what the code does must not depend on this process's filters.
        # (catch_warnings swaps the filters process-wide for the parse: a warning another
        # thread raises meanwhile is not shown.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(_unfenced(code))
    except Exception as exc:  # SyntaxError, ValueError, RecursionError, MemoryError ...
        report.unparsable("python", exc)
        return
    bindings: dict[str, str] = {}
    starred: list[str] = []
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:  # import a.b as c: c is a.b
                    bindings[alias.asname] = alias.name
                else:  # import a.b: a is a
                    bindings[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
                _python_import(alias.name, report)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name == "*":
                    starred.append(node.module)
                    _python_import(node.module, report)
                else:
                    bindings[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    _python_import(f"{node.module}.{alias.name}", report)
        elif isinstance(node, ast.Call):
            calls.append(node)
    for call in calls:
        _python_call(call, _qualified(call.func, bindings, starred), report, depth)


def _unfenced(code: str) -> str:
    """The code inside a Markdown fence (```python ... ```), or `code` as it is."""
    text = code.strip()
    newline = text.find("\n")
    if len(text) < 6 or not text.startswith("```") or not text.endswith("```") or newline < 0:
        return code
    if text[3:newline].strip().lower() not in {"", "python", "py", "python3"}:
        return code
    return text[newline + 1 : -3]


def _python_import(name: str, report: Report) -> None:
    if (effect := _module_effect(name)) is not None:
        report.add(effect, f"import {name} {_PY_PHRASES[effect]}")


def _module_effect(name: str) -> Effect | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (effect := _PY_MODULES.get(".".join(parts[:end]))) is not None:
            return effect
    return None


def _qualified(func: ast.expr, bindings: Mapping[str, str], starred: list[str]) -> str | None:
    """`func`'s dotted name with its head resolved through the imports; None when the
    callee is not a plain name or attribute chain (`f()()`, `Path(p).unlink`)."""
    attributes: list[str] = []
    while isinstance(func, ast.Attribute):
        attributes.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    head = bindings.get(func.id)
    if head is None:
        head = func.id
        for module in starred:
            if f"{module}.{func.id}" in _PY_KNOWN:
                head = f"{module}.{func.id}"
    return ".".join([head, *reversed(attributes)])


def _python_call(call: ast.Call, name: str | None, report: Report, depth: int) -> None:
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    effect = _python_call_effect(call, name, method)
    if effect is None:
        return
    report.add(effect, f"{name or '.' + str(method)}(...) {_PY_PHRASES[effect]}")
    if name in _PY_SHELL_RUNNERS and call.args:
        _python_command_line(call.args[0], report, depth)


def _python_call_effect(call: ast.Call, name: str | None, method: str | None) -> Effect | None:
    if name is not None:
        if name in _PY_OPENERS:
            return _open_mode(call, _PY_OPENERS[name], default="reads")
        if name in _PY_CALLS:
            return _PY_CALLS[name]
        if (effect := _module_effect(name)) is not None:
            return effect
    if method == "open":  # Path.open(mode) and the like: only a mode-shaped argument tells
        return _open_mode(call, 0, default=None if call.args else "reads")
    last = name.rpartition(".")[2] if name is not None else method
    return _PY_METHODS.get(last or "")


def _open_mode(call: ast.Call, position: int, *, default: Effect | None) -> Effect | None:
    mode: ast.expr | None = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if mode is None:
        return default
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return "writes_files" if position else None  # a mode nobody can read: it may write
    if not mode.value or not set(mode.value) <= _MODE_CHARACTERS:
        return None
    return "writes_files" if set(mode.value) & set("wax+") else "reads"


def _python_command_line(argument: ast.expr, report: Report, depth: int) -> None:
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        nested("shell", argument.value, report, depth)
    elif isinstance(argument, ast.List | ast.Tuple):
        words = [e.value for e in argument.elts if isinstance(e, ast.Constant)]
        if words and all(isinstance(word, str) for word in words):
            read_command([str(word) for word in words], report, depth)
