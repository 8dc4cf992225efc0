"""A chat message as the OpenAI API and the engines carry it: role, content, tool calls.

Kept as the JSON object it arrives as (a dict), not a model: the gateway passes messages
on byte-stable and reads only the fields it needs; shapes are checked where they enter
(gateway/chat/inbound.py) and where engines answer (gateway/chat/conformance.py).
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
