"""Proxy faults during real trials: garbage, truncated and oversized bodies sent to the proxy,
and the sampling engine raising during a request."""

import pytest

from tests.reliability import proxykit


def _ok(o):
  assert o.ok, f"{o.fault}/{o.backend}: {o.detail} (attempts {o.attempts})"


def test_bad_bodies_mid_trial(fault_env):
  _ok(proxykit.proxy_bad_bodies(fault_env))


def test_bad_bodies_are_client_errors(fault_env):
  """Each malformed request, sent alone, is answered 4xx (or the connection is dropped for
  a body that never arrives) and the proxy stays healthy."""
  uds = fault_env.proxy.uds
  for name, (data, read) in proxykit.bad_bodies(fault_env.proxy.config.max_body_bytes).items():
    try:
      code = proxykit.raw_request(uds, data, read=read)
    except (BrokenPipeError, ConnectionResetError):
      code = None
    if read and name != "oversized":
      assert code is not None and 400 <= code < 500, (name, code)
    else:
      assert code is None or 400 <= code < 500, (name, code)
  health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
  assert proxykit.raw_request(uds, health) == 200


@pytest.mark.slow
def test_engine_raises_during_request(fault_env, tiny_engine):
  _ok(proxykit.engine_raises(fault_env, tiny_engine.engine, tiny_engine.proxy))
  # the engine still serves after the fault
  from legorl_jax.sampling.params import SamplingParams
  out = tiny_engine.engine.generate([1, 2, 3], SamplingParams(max_tokens=4, temperature=1.0))
  assert len(out.token_ids) >= 1
