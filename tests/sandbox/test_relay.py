"""relay.py forwards TCP connections byte for byte to a Unix-socket HTTP server."""

import concurrent.futures
import http.client
import os
import socket
import subprocess
import sys
import time

from legorl_jax.sandbox import relay
sys.path.insert(0, os.path.dirname(__file__))
from unix_http import serve_unix  # noqa: E402


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_relay_round_trips_requests(tmp_path):
  sock = str(tmp_path / "proxy.sock")
  srv = serve_unix(sock)
  port, ready = _free_port(), tmp_path / "ready"
  p = subprocess.Popen([sys.executable, relay.__file__, "--listen", f"127.0.0.1:{port}", "--unix", sock,
                        "--ready-file", str(ready)])
  try:
    for _ in range(500):
      if ready.exists():
        break
      time.sleep(0.01)
    assert ready.exists()

    def post(i):
      c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
      body = (f"req{i}-".encode() * 50000)[: 300000 + i]
      c.request("POST", "/v1/chat/completions", body=body)
      r = c.getresponse()
      return r.status, r.read() == b"echo:" + body

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
      assert list(ex.map(post, range(16))) == [(200, True)] * 16
  finally:
    p.kill()
    p.wait()
    srv.shutdown()
