"""uvicorn's server as `gateway serve` runs it: it says the gateway serves once it does.

uvicorn runs the lifespan start-up (which may refuse: gateway/lifetime/startup.py), then
binds (which may fail), then serves. The line that tells a person, or `make run`'s log,
where the gateway serves is printed after both, so a gateway that did not start never
said it serves.
"""

from __future__ import annotations

import socket

import uvicorn


class ServerSayingItServes(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, serving: str) -> None:
        super().__init__(config)
        self._serving = serving  # the line to print once serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(self._serving, flush=True)
