"""The proxy: loopback only by default, sessions guarded by their own token, no secret written.

The last test runs real trials (built-in harness, local sandbox, the tiny policy sampling on a
real engine) and then searches every byte the run left behind, and every log record, for the
session tokens and the API keys present in the environment.
"""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from legorl_jax import serve
from legorl_jax.harnesses.builtin import BuiltinAdapter
from legorl_jax.proxy import ProxyConfig, ProxyServer, ScriptedBackend
from legorl_jax.rewards import status as st
from legorl_jax.rollout.runner import TrialJob, run_trials
from legorl_jax.rollout.trial import TrialConfig
from legorl_jax.sandbox import SandboxConfig, local
from tests.proxy.conftest import http

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}


def _listen_addresses(port: int) -> list[str]:
  """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp{,6})."""
  out = []
  for name in ("tcp", "tcp6"):
    try:
      with open(f"/proc/net/{name}") as f:
        rows = f.read().splitlines()[1:]
    except OSError:
      continue
    for row in rows:
      cols = row.split()
      addr, p = cols[1].split(":")
      if int(p, 16) == port and cols[3] == "0A":  # 0A = LISTEN
        if name == "tcp":
          out.append(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
        else:
          raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
          out.append(socket.inet_ntop(socket.AF_INET6, raw))
  return out


def _non_loopback_ips() -> list[str]:
  r = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
  return [ip for ip in r.stdout.split() if ":" not in ip and not ip.startswith("127.")]


def _refused(ip: str, port: int) -> bool:
  s = socket.socket()
  s.settimeout(2)
  try:
    return s.connect_ex((ip, port)) != 0
  finally:
    s.close()


def test_in_process_server_binds_loopback_by_default(tokenizer):
  server = ProxyServer(ScriptedBackend(tokenizer, lambda r: "ok"), tokenizer).start()
  try:
    assert _listen_addresses(server.port) == ["127.0.0.1"]
    assert http("GET", server.url + "/health")[0] == 200
    for ip in _non_loopback_ips():
      assert _refused(ip, server.port), ip
  finally:
    server.stop()


@pytest.mark.slow
def test_serve_cli_binds_loopback_by_default():
  assert serve._parser().parse_args(["--model", "tiny"]).host == "127.0.0.1"  # noqa: SLF001
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  p = subprocess.Popen([sys.executable, "-m", "legorl_jax.serve", "--model=tiny", "--port=0",
                        "--max_len=256", "--max_batch=1"], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    line = p.stdout.readline()
    assert line.startswith("listening on http://127.0.0.1:"), line
    port = int(line.split()[-1].rsplit(":", 1)[1])
    assert _listen_addresses(port) == ["127.0.0.1"]
    for ip in _non_loopback_ips():
      assert _refused(ip, port), ip
  finally:
    p.terminate()
    p.wait(30)


def test_another_sessions_token_is_refused_on_every_route(tokenizer):
  server = ProxyServer(ScriptedBackend(tokenizer, lambda r: "scripted reply"), tokenizer,
                       ProxyConfig(admin_token="admin-secret")).start()
  try:
    a, b = server.create_session(), server.create_session()
    routes = []
    for v in ("/v1", ""):
      routes += [("POST", f"{v}/chat/completions", CHAT), ("POST", f"{v}/responses", RESPONSES),
                 ("POST", f"{v}/messages", MESSAGES), ("POST", f"{v}/messages/count_tokens", MESSAGES),
                 ("GET", f"{v}/models", None)]
    routes += [("GET", "/trajectory", None), ("DELETE", "", None)]
    for method, path, body in routes:
      url = f"{server.url}/sess/{a.session_id}{path}"
      for token, headers, want in ((b.token, None, 403), (None, {"x-api-key": b.token}, 403),
                                   ("forged", None, 403), (None, None, 401)):
        status, resp = http(method, url, token, body, headers=headers)
        assert status == want, (method, path, status, resp)
        assert "error" in resp and b.token not in json.dumps(resp)
    assert server.sessions.get(a.session_id) is not None  # the foreign DELETE did nothing
    assert server.sessions.get(a.session_id).trajectory()["calls"] == []  # nothing was recorded
    # The owner's token works on the same routes.
    for method, path, body in routes[:5]:
      status, _ = http(method, f"{server.url}/sess/{a.session_id}{path}", a.token, body)
      assert status == 200, (method, path)
    assert len(server.sessions.get(a.session_id).trajectory()["calls"]) == 3
    status, _ = http("DELETE", f"{server.url}/sess/{a.session_id}", a.token)
    assert status == 200 and server.sessions.get(a.session_id) is None
    # Creating sessions needs the admin token; a session token is not one.
    for token in (None, b.token, "admin-secre"):
      assert http("POST", f"{server.url}/sess", token, {})[0] == 403
    status, resp = http("POST", f"{server.url}/sess", "admin-secret", {})
    assert status == 200 and resp["token"] not in (a.token, b.token)
  finally:
    server.stop()


class _TokenRecorder:
  """The proxy as ``run_trial`` uses it, remembering every session token it hands out."""

  def __init__(self, proxy):
    self._proxy, self.tokens = proxy, []

  def create_session(self, *args, **kwargs):
    handle = self._proxy.create_session(*args, **kwargs)
    self.tokens.append(handle.token)
    return handle

  def __getattr__(self, name):
    return getattr(self._proxy, name)


@pytest.mark.skipif(local.bwrap_path() is None, reason="bubblewrap not installed")
def test_no_token_or_api_key_in_logs_trajectories_or_trial_records(tmp_path, monkeypatch, caplog,
                                                                     tiny_policy_proxy, easy_tasks):
  keys = {"OPENAI_API_KEY": "sk-host-openai-5f1e2d", "ANTHROPIC_API_KEY": "sk-ant-host-9c8b7a",
          "HF_TOKEN": "hf_host_token_3a4b5c"}
  for k, v in keys.items():
    monkeypatch.setenv(k, v)
  caplog.set_level(logging.DEBUG)
  proxy = _TokenRecorder(tiny_policy_proxy.proxy)
  out = tmp_path / "run"
  cfg = TrialConfig(harness_timeout_s=240, max_turns=2, sandbox=SandboxConfig())
  res = run_trials([TrialJob(t, BuiltinAdapter(max_tokens=24)) for t in easy_tasks[:2]], proxy, cfg,
                   str(out), concurrency=2, max_retries=0)
  assert all(r.status in (st.FAILED, st.SOLVED) for r in res), [(r.status, r.error[:300]) for r in res]
  assert all(r.turns >= 1 for r in res)  # the harness did authenticate with its token
  assert len(proxy.tokens) == 2 and all(len(t) >= 24 for t in proxy.tokens)
  secrets = [t.encode() for t in proxy.tokens] + [v.encode() for v in keys.values()]
  files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]
  names = {os.path.basename(f) for f in files}
  assert {"trials.jsonl", "summary.json", "trajectory.json", "harness.stdout", "harness.stderr",
          "agent_log.jsonl"} <= names, names
  for path in files:
    with open(path, "rb") as f:
      data = f.read()
    for s in secrets:
      assert s not in data, (path, s)
  logged = caplog.text + "\n".join(str(r.args) for r in caplog.records)
  for s in secrets:
    assert s.decode() not in logged
  assert len(tiny_policy_proxy.proxy.sessions) == 0  # sessions (and their tokens) end with their trial
