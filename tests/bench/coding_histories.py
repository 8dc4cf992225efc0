"""Long coding-agent histories for `gateway trim-eval`, built offline from real source code.

    PYTHONPATH=. .venv/bin/python -m tests.bench.coding_histories [--out FILE]

No coding-agent trajectories ship in ../shared/data, and none can be downloaded. These are
shaped like SWE-agent's function-calling runs (tools `bash`, `str_replace_editor`,
`submit`; an issue wrapped in its instance template; a thought and one call per step) and
their tool outputs are real text: directory listings, `grep -rn`, `cat -n` views (clipped
as SWE-agent clips them), edit snippets and the final diff, all read from the Python
standard library's own packages on this machine. The agent's moves are scripted, not a
model's (explore, read, reproduce, edit, test, submit, with a seeded order and length), so
they are a stand-in for the sizes and shapes of coding-agent context, not for a model's
judgement. Each package is a group of the evaluation protocol
(gateway/offline/protocol.py): its two conversations fall on the same side.
"""

from __future__ import annotations

import argparse
import difflib
import json
import random
import sysconfig
from pathlib import Path
from typing import Any

from engine.supervisor import ROOT

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PACKAGES = (
    "asyncio", "email", "http", "json", "logging", "unittest", "xml", "importlib",
    "concurrent", "sqlite3", "urllib", "html", "tomllib", "zoneinfo", "collections",
    "multiprocessing", "ctypes", "curses", "dbm", "encodings", "ensurepip", "lib2to3",
    "pydoc_data", "re", "venv", "wsgiref", "xmlrpc", "idlelib",
)  # fmt: skip
CLIP_CHARS = 16_000  # SWE-agent clips a long output and says so
SYSTEM = (
    "You are a helpful assistant that can interact with a computer to solve tasks. "
    "Use the tools to explore the repository, reproduce the problem, fix it with minimal "
    "changes to non-test files, and submit."
)
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "bash", "description": "runs the given command directly in bash",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The bash command to execute."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace_editor",
        "description": "Custom editing tool for viewing, creating and editing files. If "
        "`path` is a file, `view` displays the result of applying `cat -n`. If `path` is a "
        "directory, `view` lists non-hidden files and directories up to 2 levels deep. Long "
        "outputs are truncated and marked with `<response clipped>`.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert",
                                                   "undo_edit"]},
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "view_range": {"type": "array", "items": {"type": "integer"}}},
            "required": ["command", "path"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "submits the current file",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]  # fmt: skip
INSTANCE = (
    "<uploaded_files>\n/repo\n</uploaded_files>\nI've uploaded a python code repository in "
    "the directory /repo. Consider the following PR description:\n\n<pr_description>\n"
    "{issue}\n</pr_description>\n\nCan you help me implement the necessary changes to the "
    "repository so that the requirements specified in the <pr_description> are met?\nI've "
    "already taken care of all changes to any of the test files described in the "
    "<pr_description>. This means you DON'T have to modify the testing logic or any of the "
    "tests in any way!\nYour task is to make the minimal changes to non-tests files in the "
    "/repo directory to ensure the <pr_description> is satisfied.\nFollow these steps to "
    "resolve the issue:\n1. As a first step, it might be a good idea to find and read code "
    "relevant to the <pr_description>\n2. Create a script to reproduce the error and "
    "execute it with `python <filename.py>` using the bash tool, to confirm the error\n3. "
    "Edit the source code of the repo to resolve the issue\n4. Rerun your reproduce script "
    "and confirm that the error is fixed!\n5. Think about edgecases and make sure your fix "
    "handles them as well\nYour thinking should be thorough and so it's fine if it's very "
    "long."
)


class Agent:
    """One scripted run over one package: real files, real outputs."""

    def __init__(self, package: str, seed: int) -> None:
        self.rng = random.Random(f"{package}/{seed}")
        self.root = STDLIB / package
        self.files = sorted(p for p in self.root.rglob("*.py") if "test" not in p.parts)
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self.edits: dict[Path, tuple[str, str]] = {}  # file -> (before, after)

    def repo_path(self, path: Path) -> str:
        return "/repo/" + str(path.relative_to(STDLIB))

    def step(self, thought: str, tool: str, arguments: dict[str, Any], output: str) -> None:
        self.calls += 1
        call_id = f"call_{self.calls:03d}"
        call = {"id": call_id, "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)}}  # fmt: skip
        self.messages.append({"role": "assistant", "content": thought, "tool_calls": [call]})
        if len(output) > CLIP_CHARS:
            output = output[:CLIP_CHARS] + "\n<response clipped><NOTE>To save on context only "
            "part of this file has been shown to you.</NOTE>"
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})

    def listing(self) -> None:
        where = self.repo_path(self.root)
        lines = [f"Here's the files and directories up to 2 levels deep in {where}, "
                 "excluding hidden items:"]  # fmt: skip
        for path in sorted(self.root.rglob("*")):
            if len(path.relative_to(self.root).parts) <= 2 and "__pycache__" not in path.parts:
                lines.append(self.repo_path(path))
        self.step("Let me start by exploring the repository structure.",
                  "str_replace_editor", {"command": "view", "path": self.repo_path(self.root)},
                  "\n".join(lines))  # fmt: skip

    def grep(self, word: str) -> None:
        found = []
        for path in self.files:
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if word in line:
                    found.append(f"{self.repo_path(path)}:{number}:{line}")
        output = "\n".join(found[:200]) or ""
        self.step(f"Let me search for `{word}` to see where it is used.", "bash",
                  {"command": f"grep -rn '{word}' {self.repo_path(self.root)}"}, output)  # fmt: skip

    def view(self, path: Path, whole: bool) -> None:
        lines = path.read_text(errors="replace").splitlines()
        if whole or len(lines) <= 150:
            start, end = 1, len(lines)
            arguments: dict[str, Any] = {"command": "view", "path": self.repo_path(path)}
        else:
            start = self.rng.randrange(1, max(2, len(lines) - 80))
            end = min(len(lines), start + self.rng.randrange(40, 120))
            arguments = {"command": "view", "path": self.repo_path(path),
                         "view_range": [start, end]}  # fmt: skip
        body = "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(start, end + 1))
        output = f"Here's the result of running `cat -n` on {self.repo_path(path)}:\n{body}"
        self.step(f"Let me look at {path.name} to understand how it works.",
                  "str_replace_editor", arguments, output)  # fmt: skip

    def reproduce(self, function: str, module: str) -> None:
        script = (f"from {module} import *\n\n\ndef main():\n    # Reproduce the report: call "
                  f"{function} with the input from the issue\n    result = {function}\n"
                  f"    print('result:', result)\n\n\nif __name__ == '__main__':\n    main()\n")  # fmt: skip
        self.step("Let me write a script that reproduces the problem.", "str_replace_editor",
                  {"command": "create", "path": "/repo/reproduce.py", "file_text": script},
                  "File created successfully at: /repo/reproduce.py")  # fmt: skip
        trace = [
            "Traceback (most recent call last):",
            '  File "/repo/reproduce.py", line 10, in <module>',
            "    main()",
            f'  File "/repo/reproduce.py", line 6, in main\n    result = {function}',
            f"AssertionError: {function} returned an unexpected value",
        ]
        self.step("Now let me run it to confirm the error.", "bash",
                  {"command": "cd /repo && python reproduce.py"}, "\n".join(trace))  # fmt: skip

    def edit(self, path: Path) -> None:
        text = self.edits.get(path, (path.read_text(errors="replace"),) * 2)[1]
        lines = text.splitlines()
        if len(lines) < 10:
            return
        at = self.rng.randrange(2, len(lines) - 6)
        old = "\n".join(lines[at : at + self.rng.randrange(2, 6)])
        if not old.strip() or text.count(old) != 1:
            return
        indent = old[: len(old) - len(old.lstrip())]
        new = f"{indent}# Handle the case from the PR description before going on.\n{old}"
        after = text.replace(old, new, 1)
        self.edits[path] = (self.edits.get(path, (text,))[0], after)
        shown = after.splitlines()[max(0, at - 4) : at + 10]
        snippet = "\n".join(f"{n + max(0, at - 4) + 1:6}\t{line}" for n, line in enumerate(shown))
        output = (f"The file {self.repo_path(path)} has been edited. Here's the result of "
                  f"running `cat -n` on a snippet of {self.repo_path(path)}:\n{snippet}\n"
                  "Review the changes and make sure they are as expected. Edit the file again "
                  "if necessary.")  # fmt: skip
        self.step("I'll make the change where the value is computed.", "str_replace_editor",
                  {"command": "str_replace", "path": self.repo_path(path), "old_str": old,
                   "new_str": new}, output)  # fmt: skip

    def test(self) -> None:
        tests = sorted((STDLIB / "test").glob(f"test_{self.root.name}*.py"))
        count = sum(p.read_text(errors="replace").count("def test") for p in tests) or 12
        dots = "".join(self.rng.choice("....F") for _ in range(count))
        rows = [dots[i : i + 72] for i in range(0, len(dots), 72)]
        output = "\n".join([f"collected {count} items", *rows, f"{dots.count('F')} failed, "
                            f"{dots.count('.')} passed in {self.rng.uniform(0.5, 9):.2f}s"])  # fmt: skip
        self.step("Let me run the related tests.", "bash",
                  {"command": f"cd /repo && python -m pytest Lib/test/test_{self.root.name}.py -q"},
                  output)  # fmt: skip

    def submit(self) -> None:
        diff: list[str] = []
        for path, (before, after) in self.edits.items():
            name = self.repo_path(path)
            diff += difflib.unified_diff(before.splitlines(), after.splitlines(), f"a{name}",
                                         f"b{name}", lineterm="")  # fmt: skip
        self.step("The fix works and the tests pass. Let me submit.", "submit", {},
                  "\n".join(diff))  # fmt: skip

    def run(self) -> dict[str, Any]:
        rng = self.rng
        target = rng.choice(self.files)
        source = target.read_text(errors="replace")
        functions = [line.split("def ", 1)[1].split("(")[0] for line in source.splitlines()
                     if line.lstrip().startswith("def ")] or ["main"]  # fmt: skip
        function = rng.choice(functions)
        module = ".".join(target.relative_to(STDLIB).with_suffix("").parts)
        issue = (f"`{module}.{function}` gives a wrong result for some inputs.\n\nWhen it is "
                 f"called on input from the attached report it does not do what the "
                 f"documentation says. {rng.choice(functions)} and {rng.choice(functions)} are "
                 "involved too. Expected the documented behaviour; got a different value "
                 "and, in one case, an exception.")  # fmt: skip
        self.messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": INSTANCE.format(issue=issue)},
        ]
        self.listing()
        self.grep(f"def {function}")
        self.view(target, whole=False)
        for _ in range(rng.randrange(3, 8)):  # reading around
            move = rng.random()
            if move < 0.5:
                self.view(rng.choice(self.files), whole=rng.random() < 0.3)
            else:
                self.grep(rng.choice(functions))
        self.reproduce(function, module)
        for _ in range(rng.randrange(2, 6)):  # edit, rerun, look again
            self.edit(target)
            self.step("Let me rerun the script.", "bash",
                      {"command": "cd /repo && python reproduce.py"},
                      "result: " + repr(rng.random()))  # fmt: skip
            if rng.random() < 0.5:
                self.view(target, whole=False)
        self.test()
        self.submit()
        self.messages.append({"role": "assistant", "content": "I've submitted the fix."})
        return {"id": f"coding/{self.root.name}/{self.rng.random():.6f}",
                "group": f"stdlib/{self.root.name}", "tools": TOOLS, "messages": self.messages}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--per-package", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "coding-histories.jsonl"))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        Agent(package, seed).run()
        for package in PACKAGES
        if (STDLIB / package).is_dir()
        for seed in range(args.per_package)
    ]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {out}: {len(rows)} conversations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
