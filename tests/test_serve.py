"""``python -m legorl_jax.serve`` as a subprocess: TCP (port 0) and a Unix socket."""

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import urllib.request

import aiohttp
import pytest

from tests.xla_flags import subprocess_xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_serve_tiny_on_tcp_and_unix_socket():
  with tempfile.TemporaryDirectory() as tmp:
    sock = f"{tmp}/policy.sock"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
               XLA_FLAGS=subprocess_xla_flags(1))
    proc = subprocess.Popen(
        [sys.executable, "-m", "legorl_jax.serve", "--model=tiny", "--port=0", f"--uds={sock}",
         "--max_batch=2", "--max_len=256", "--model_name=tiny-policy"],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
      line = proc.stdout.readline()  # blocks until the server is up (or the process died)
      if not line.startswith("listening on "):
        proc.wait(timeout=60)
        raise AssertionError(f"server did not start: {line!r}\n{proc.stderr.read()}")
      url, unix = line.split()[2:4]
      assert url.startswith("http://127.0.0.1:") and unix == f"unix:{sock}"
      with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny-policy"

      async def over_socket():
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
          async with s.get("http://localhost/v1/models") as r:
            return r.status, await r.json()

      status, body = asyncio.run(over_socket())
      assert status == 200 and body["data"][0]["context_window"] == 256
    finally:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, proc.stderr.read()
