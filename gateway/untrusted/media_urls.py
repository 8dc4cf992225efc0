"""Media named by URL in a chat request: the engine would fetch it, so the gateway refuses.

vLLM serving a multimodal model downloads every `http(s)://` URL an image, audio or video
content part names (`vllm/multimodal/media/connector.py`: any host, unless the engine was
started with `--allowed-media-domains`), from inside the cluster, where the engines sit
beside Redis, the gateway's admin port and the cloud's metadata service. A request that
names `http://169.254.169.254/...` would have the engine fetch it for the client: the
gateway's rule that whatever a client sends is data (it never fetches a URL a request
names) would hold for the gateway and fail one hop later. `file://` URLs read the engine's
disk where it allows a directory. So media comes inline, as a `data:` URL (the OpenAI
SDKs' base64 form), or from a host the policy names in `limits.media_url_hosts`.

Which parts carry URLs is vLLM's own map (`vllm/renderers/chat_utils.py` `MM_PARSER_MAP`
and its parts without a `type`): `image_url`, `audio_url`, `video_url`, each a string or
`{"url": ...}`, and the Responses-style `input_image`'s `image_url` string. A part is
judged by those keys whatever its `type` says, as vLLM reads a part without one by them.
`data:` is recognised exactly as vLLM does (the first five characters, any case), so the
two cannot disagree on what is inline. An allowed host is matched on a URL parsed
conservatively: `http` or `https`, no user part, no backslash, space or control character
anywhere, so that no URL parser reads a different host from it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from gateway.errors import InvalidRequest

# The content-part keys vLLM takes a media URL from.
_URL_KEYS = ("image_url", "audio_url", "video_url")
# A DNS name or an IPv4 address: the only hosts `limits.media_url_hosts` lists, and the
# only ones read from a URL (an IPv6 literal, a percent sign or a bracket is read by no
# two parsers alike). Bounded labels: linear to match.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_SCHEMES = ("http://", "https://")
_AUTHORITY_ENDS = "/?#"


def check_media_urls(messages: list[Any], allowed_hosts: Collection[str]) -> None:
    """400 `unsupported_media_url` for the first content part whose media the engine would
    fetch from a host the policy does not allow."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):  # a string: text only
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            for key in _URL_KEYS:
                if key not in part:
                    continue
                value = part[key]
                url = value.get("url") if isinstance(value, dict) else value
                if isinstance(url, str):
                    where = f"messages[{i}].content[{j}].{key}"
                    where = f"{where}.url" if isinstance(value, dict) else where
                    check_media_url(url, allowed_hosts, where)


def check_media_url(url: str, allowed_hosts: Collection[str], param: str) -> None:
    """400 `unsupported_media_url`, naming `param`, unless the engine would take `url`
    without fetching it, or from a host the policy allows."""
    if _inline_or_allowed(url, allowed_hosts):
        return
    allowed = f" (URLs are taken only from {', '.join(sorted(allowed_hosts))})."
    raise InvalidRequest(
        "Media is not fetched from URLs: send it inline as a base64 `data:` URL"
        + (allowed if allowed_hosts else "."),
        param=param,
        code="unsupported_media_url",
    )


def _inline_or_allowed(url: str, allowed_hosts: Collection[str]) -> bool:
    if url[:5].lower() == "data:":  # vLLM's own test: decoded, never fetched
        return True
    return bool(allowed_hosts) and host_of(url) in allowed_hosts


def host_of(url: str) -> str | None:
    """The lowercased host of a plain `http(s)://host[:port]/...` URL whose host is a DNS
    name or an IPv4 address; None for anything a parser might read another way (a user
    part, a backslash, whitespace, a control or non-ASCII character, a port that is not
    digits) or another scheme."""
    if not url.isascii() or any(c <= " " or c in "\\\x7f" for c in url):
        return None
    lowered = url.lower()
    scheme = next((s for s in _SCHEMES if lowered.startswith(s)), None)
    if scheme is None:
        return None
    rest = lowered[len(scheme) :]
    end = min((k for k in map(rest.find, _AUTHORITY_ENDS) if k >= 0), default=len(rest))
    authority = rest[:end]
    if "@" in authority:
        return None
    host, colon, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if colon and not port.isdigit():
        return None
    return host if HOST_NAME.fullmatch(host) else None
