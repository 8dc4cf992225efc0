"""Load a policy YAML into a validated `Policy`, or fail naming file, key path and line.

Strings may use `${VAR}` or `${VAR:-default}` to take a value from the environment, so one
policy file serves a laptop and a cluster.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from gateway.policy.approvals import approval_references
from gateway.policy.quota import budget_problems
from gateway.policy.schema import Policy
from gateway.policy.tenant_checks import tenant_setting_problems
from gateway.policy.tiering import LearnedRouterSpec

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class PolicyProblem:
    path: str
    message: str
    line: int | None = None

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {self.path or '<top level>'}: {self.message}"


class PolicyError(Exception):
    """The policy cannot be used; `str()` lists every problem, one per line."""

    def __init__(self, source: str, problems: Sequence[PolicyProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(p.render(source) for p in self.problems))


def load_policy(path: str | Path) -> Policy:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(
            source, [PolicyProblem("", f"cannot read the file: {exc.strerror}")]
        ) from exc
    # absolute(), not resolve(): a Kubernetes ConfigMap file is a symlink into a
    # timestamped directory that the next update deletes; paths stay next to the name given.
    return parse_policy(text, source=source, base_dir=Path(path).absolute().parent)


def parse_policy(text: str, *, source: str = "<policy>", base_dir: Path | None = None) -> Policy:
    try:
        root_node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise PolicyError(source, [PolicyProblem("", f"not valid YAML: {exc}", line)]) from exc
    if not isinstance(data, dict):
        raise PolicyError(source, [PolicyProblem("", "expected a mapping at the top level")])

    lines = _LineIndex(root_node)
    try:
        expanded = _expand_env(data, ())
    except _EnvMissing as exc:
        path = _dotted(exc.path)
        problem = PolicyProblem(
            path, f"environment variable {exc.name} is not set", lines.of(exc.path)
        )
        raise PolicyError(source, [problem]) from None

    # Cross-references are checked on the raw data too, so one run reports every problem.
    problems = _reference_problems(expanded, lines)
    try:
        policy = Policy.model_validate(expanded)
    except ValidationError as exc:
        problems += [
            PolicyProblem(_dotted(err["loc"]), _explain(err), lines.of(err["loc"]))
            for err in exc.errors()
        ]
    if not problems:  # tenants' settings against the rest, once every reference holds
        problems = [
            PolicyProblem(_dotted(loc), message, lines.of(loc))
            for loc, message in tenant_setting_problems(policy)
        ]
    if problems:
        raise PolicyError(source, sorted(problems, key=lambda p: (p.line or 0, p.path)))
    return _resolve_paths(policy, base_dir) if base_dir else policy


def _explain(err: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key (not part of the policy schema)"
    if kind == "missing":
        return "required key is missing"
    message = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, (str, int, float, bool)) and kind not in ("missing",):
        return f"{message} (got {_quoted(value)})"
    return message


def _quoted(value: str | float | bool) -> str:
    """A value as a problem quotes it, but for a URL's password (`state.redis_url` may
    hold one, and problems are printed and logged)."""
    if isinstance(value, str) and "@" in value:
        try:
            password = urlsplit(value).password
        except ValueError:
            password = None
        if password:
            value = value.replace(f":{password}@", ":[REDACTED]@", 1)
    return repr(value)


def _reference_problems(data: dict[str, Any], lines: _LineIndex) -> list[PolicyProblem]:
    """Problems between keys (a model naming an undefined pool, a pool with no replica
    source), read off the raw mapping so they are found even when other keys are invalid."""
    problems: list[PolicyProblem] = []
    raw_pools, raw_models = data.get("pools"), data.get("models")
    pools: dict[Any, Any] = raw_pools if isinstance(raw_pools, dict) else {}
    models: dict[Any, Any] = raw_models if isinstance(raw_models, dict) else {}
    defined = ", ".join(sorted(str(name) for name in pools)) or "(no pools defined)"
    loc: tuple[str, ...]
    raw_tiering = data.get("tiering")
    tiering: dict[Any, Any] = raw_tiering if isinstance(raw_tiering, dict) else {}
    for alias, model in models.items():
        pool = model.get("pool") if isinstance(model, dict) else None
        if isinstance(pool, str) and pool not in pools:
            loc = ("models", str(alias), "pool")
            message = f"pool {pool!r} is not defined (expected one of: {defined})"
            problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
        fallbacks = model.get("fallbacks") if isinstance(model, dict) else None
        for i, fallback in enumerate(fallbacks if isinstance(fallbacks, list) else ()):
            if isinstance(fallback, str) and (fallback not in models or fallback == alias):
                where: tuple[str | int, ...] = ("models", str(alias), "fallbacks", i)
                why = "is this model itself" if fallback == alias else "is not a defined model"
                problem = PolicyProblem(_dotted(where), f"{fallback!r} {why}", lines.of(where))
                problems.append(problem)
        route = model.get("tiering") if isinstance(model, dict) else None
        if isinstance(route, str) and route not in tiering:
            loc = ("models", str(alias), "tiering")
            known = ", ".join(sorted(str(name) for name in tiering)) or "(no tiering defined)"
            message = f"tiering {route!r} is not defined (expected one of: {known})"
            problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
    for route_name, route in tiering.items():
        tiers = route.get("tiers") if isinstance(route, dict) else None
        for tier, pool in (tiers or {}).items() if isinstance(tiers, dict) else ():
            if isinstance(pool, str) and pool not in pools:
                loc = ("tiering", str(route_name), "tiers", str(tier))
                message = f"pool {pool!r} is not defined (expected one of: {defined})"
                problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
    problems += _tenant_problems(data, models, lines)
    problems += [  # approvals naming undefined models or tenants (gateway/policy/approvals.py)
        PolicyProblem(_dotted(loc), message, lines.of(loc))
        for loc, message in approval_references(data)
    ]
    for name, pool in pools.items():
        sources = ("replicas", "engine_state", "discover")
        if isinstance(pool, dict) and not any(pool.get(source) for source in sources):
            loc = ("pools", str(name))
            message = "a pool needs `replicas`, `engine_state`, `discover`, or a mix"
            problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
    return problems


def _tenant_problems(
    data: dict[str, Any], models: dict[Any, Any], lines: _LineIndex
) -> list[PolicyProblem]:
    """A tenant allowed a model alias that is not defined, or a budget downgrading to one
    it may not use; one key digest listed twice (it could name only one tenant)."""
    problems: list[PolicyProblem] = []
    raw_tenants = data.get("tenants")
    tenants: dict[Any, Any] = raw_tenants if isinstance(raw_tenants, dict) else {}
    known = ", ".join(sorted(str(name) for name in models)) or "(no models defined)"
    first_seen: dict[str, str] = {}
    for name, tenant in tenants.items():
        if not isinstance(tenant, dict):
            continue
        allowed = tenant.get("models")
        for i, alias in enumerate(allowed if isinstance(allowed, list) else ()):
            if isinstance(alias, str) and alias not in models:
                loc: tuple[str | int, ...] = ("tenants", str(name), "models", i)
                message = f"model {alias!r} is not defined (expected one of: {known})"
                problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
        for where, message in budget_problems(tenant, models):  # the budget's downgrade_to
            loc = ("tenants", str(name), *where)
            problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
        keys = tenant.get("keys")
        for i, key in enumerate(keys if isinstance(keys, list) else ()):
            digest = key.get("sha256") if isinstance(key, dict) else None
            if not isinstance(digest, str):
                continue
            loc = ("tenants", str(name), "keys", i, "sha256")
            if digest in first_seen:
                message = f"this key digest is already a key of {first_seen[digest]}"
                problems.append(PolicyProblem(_dotted(loc), message, lines.of(loc)))
            else:
                first_seen[digest] = f"tenants.{name}"
    return problems


def _resolved_artifacts(
    learned: LearnedRouterSpec, resolve: Callable[[str], str]
) -> LearnedRouterSpec:
    """The router artifacts (live, and the shadow's) relative to the policy file."""
    update: dict[str, Any] = {}
    if learned.artifact:
        update["artifact"] = resolve(learned.artifact)
    if learned.shadow is not None:
        shadow = learned.shadow.model_copy(update={"artifact": resolve(learned.shadow.artifact)})
        update["shadow"] = shadow
    return learned.model_copy(update=update) if update else learned


def _resolve_paths(policy: Policy, base_dir: Path) -> Policy:
    """Relative paths in a policy are relative to the policy file, not the cwd."""

    def resolve(path: str) -> str:
        # Lexically normalised (no symlinks followed), for the reason `load_policy` gives.
        return path if Path(path).is_absolute() else os.path.normpath(base_dir / path)

    pools = {
        name: pool.model_copy(update={"engine_state": resolve(pool.engine_state)})
        if pool.engine_state
        else pool
        for name, pool in policy.pools.items()
    }
    state = policy.state.model_copy(update={"embedded_dir": resolve(policy.state.embedded_dir)})
    auth = policy.auth
    if auth.keys_file:
        auth = auth.model_copy(update={"keys_file": resolve(auth.keys_file)})
    if auth.admin_keys_file:
        auth = auth.model_copy(update={"admin_keys_file": resolve(auth.admin_keys_file)})
    telemetry = policy.telemetry
    if telemetry.request_log:
        telemetry = telemetry.model_copy(update={"request_log": resolve(telemetry.request_log)})
    tiering = {
        name: spec.model_copy(update={"learned": _resolved_artifacts(spec.learned, resolve)})
        if spec.learned is not None
        else spec
        for name, spec in policy.tiering.items()
    }
    return policy.model_copy(
        update={
            "pools": pools,
            "state": state,
            "auth": auth,
            "telemetry": telemetry,
            "tiering": tiering,
        }
    )


class _EnvMissing(Exception):
    def __init__(self, name: str, path: tuple[str | int, ...]) -> None:
        self.name = name
        self.path = path


def _expand_env(value: Any, path: tuple[str | int, ...]) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            found = os.environ.get(name)
            if found is not None and found != "":
                return found
            if default is not None:
                return default
            raise _EnvMissing(name, path)

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {k: _expand_env(v, (*path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, (*path, i)) for i, v in enumerate(value)]
    return value


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _LineIndex:
    """Finds the YAML line of a key path, so errors point at the line to fix."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._root = root

    def of(self, loc: Sequence[str | int]) -> int | None:
        node = self._root
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                match = next((kv for kv in node.value if kv[0].value == str(part)), None)
                if match is None:
                    return line
                line = match[0].start_mark.line + 1
                node = match[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return line
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line
