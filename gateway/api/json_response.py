"""The one way the gateway's own routes answer with JSON (the inference calls render the
pipeline's `Served` value instead: gateway/api/inference.py)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")
