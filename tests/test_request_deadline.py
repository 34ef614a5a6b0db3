"""A streamed request ends at request_timeout_s however the server behaves. llama-server sends an SSE ping
every 30 s while it waits for its own results, so a server that hangs mid-answer but keeps its HTTP thread
alive never lets a read timeout fire (a CI run once waited 80 minutes on one). These servers speak just
enough HTTP to stand for each behaviour; the real llama-server case is in test_faults.py."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from crashline.engine.workloads import stream_request


class _Stream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    tokens = 0  # data chunks sent before the server stalls
    ping_every_s: float | None = None  # SSE pings while stalled; None: silence

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(self.tokens):
            self._chunk(b'data: {"content": "x", "stop": false}\n\n')
        stalled_until = time.monotonic() + 30
        while time.monotonic() < stalled_until:
            if self.ping_every_s is None:
                time.sleep(0.1)
                continue
            time.sleep(self.ping_every_s)
            try:
                self._chunk(b":\n\n")
            except OSError:  # the client hung up
                return

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    servers = []

    def start(tokens: int, ping_every_s: float | None) -> str:
        handler = type("Handler", (_Stream,), {"tokens": tokens, "ping_every_s": ping_every_s})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()


@pytest.mark.parametrize(
    "tokens, ping_every_s",
    [(3, 0.2), (0, 0.2), (3, None)],
    ids=["tokens then pings", "only pings", "tokens then silence"],
)
def test_a_stalled_stream_times_out_at_the_deadline(serve, tokens, ping_every_s):
    url = serve(tokens, ping_every_s)
    arrivals = []
    started = time.monotonic()
    with pytest.raises(requests.Timeout, match="no answer within 1.5 s"):
        stream_request(url, [1, 2, 3], 100, timeout_s=1.5, on_chunk=arrivals.append)
    took = time.monotonic() - started
    assert 1.4 < took < 4, f"the request ended after {took:.1f} s, not at its 1.5 s deadline"
    assert len(arrivals) == tokens, "every token before the stall was seen"
