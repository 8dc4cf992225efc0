"""A stand-in for a vLLM replica whose process tree has vLLM's shape, for
tests/engine/test_stopping.py: an API server that answers every GET with 200 (`/health`
included) and starts an engine core, which starts a worker. As in vLLM, the engine core
stays in its API server's process group and does not notice when its parent dies.

Run as the engine environment's python (`ENGINE_PYTHON`, see tests/engine/test_stopping.py):
`stand_in_vllm.py -m <server module> ... --port N ...`; `core` and `worker` are its children.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import time


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        time.sleep(3600)
    elif argv[:1] == ["core"]:
        worker = subprocess.Popen([sys.executable, __file__, "worker"])
        worker.wait()
    else:
        port = int(argv[argv.index("--port") + 1])
        subprocess.Popen([sys.executable, __file__, "core"])
        http.server.HTTPServer(("127.0.0.1", port), _Health).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
