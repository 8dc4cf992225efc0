"""What a request is charged when it is admitted, before any engine has counted it.

No tokenizer runs on the hot path: the prompt is taken as a quarter of the request's
bytes (BPE tokenizers average about four characters of English per token; the JSON
around the messages makes this an overestimate, and UTF-8's longer characters
roughly keep it honest for other scripts), and the completion as the `max_tokens` (or
`max_completion_tokens`) the request asks for, at most the engines' whole context window
(a larger limit could never bind, and is sent as the window: InboundRequest.output_capped),
times `n` (at most `limits.max_n`: gateway/chat/inbound.py), or nothing when it sets no
ceiling. The guess only decides admission: once the response has been sent, the charge is
replaced by the engine's own count (gateway/quota/service.py).
"""

from __future__ import annotations

from typing import Any

from gateway.chat.inbound import InboundRequest
from gateway.policy import Endpoint
from gateway.policy.telemetry import PriceSpec

BYTES_PER_TOKEN = 4


def estimate_tokens(
    request: InboundRequest, body_bytes: int, context_tokens: int | None = None
) -> tuple[int, int]:
    """(prompt, completion) tokens; `context_tokens`: the engines' window, when known."""
    prompt = max(1, -(-body_bytes // BYTES_PER_TOKEN))
    if request.endpoint is Endpoint.embeddings:
        return prompt, 0
    body = request.body
    ceiling = _count(body.get("max_completion_tokens")) or _count(body.get("max_tokens"))
    if context_tokens is not None:
        ceiling = min(ceiling, context_tokens)
    return prompt, ceiling * (_count(body.get("n")) or 1)


def estimate_nusd(price: PriceSpec | None, prompt: int, completion: int) -> int:
    """Nano-dollars at the price of the model asked for (its dearest tier when routable:
    the tier is chosen later), prompt tokens all uncached."""
    if price is None:
        return 0
    return round(prompt * price.input * 1000 + completion * price.output * 1000)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
