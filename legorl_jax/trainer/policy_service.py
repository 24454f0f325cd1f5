"""The policy as the harnesses see it: one sampling engine behind proxies on Unix sockets.

Each proxy has its own forced sampling temperature (RL sampling, greedy evaluation) and its
own socket; all share the engine, so a weight sync reaches every one of them at once.
"""

from __future__ import annotations

import os

from legorl_jax.proxy.backend import EngineBackend, ScriptedBackend
from legorl_jax.proxy.server import ProxyServer
from legorl_jax.proxy.service import ProxyConfig
from legorl_jax.sampling.engine import Engine


class PolicyService:
  """Owns the engine and named proxies. ``proxy(name, temperature)`` starts one on demand."""

  def __init__(self, model, tokenizer, cfg, socket_dir: str):
    self.tokenizer = tokenizer
    self.cfg = cfg
    self.socket_dir = socket_dir
    os.makedirs(socket_dir, exist_ok=True)
    self.engine = Engine(
        model, max_batch=int(cfg.engine.max_batch), max_len=int(cfg.engine.max_len),
        prefill_buckets=tuple(cfg.engine.prefill_buckets), decode_chunk=int(cfg.engine.decode_chunk),
        seed=int(cfg.get("seed", 0)), decode_fn=tokenizer,
        prefix_reuse=bool(cfg.engine.get("prefix_cache", True)),
        prefix_cache_gb=float(cfg.engine.get("prefix_cache_gb", 0.0)),
        attn_step=int(cfg.engine.get("attn_step", 128)),
        share_prefix=bool(cfg.engine.get("share_prefix", False)))
    self.engine.start()
    self._proxies: dict[str, ProxyServer] = {}

  def proxy(self, name: str, temperature: float | None) -> ProxyServer:
    if name not in self._proxies:
      config = ProxyConfig(force_temperature=temperature,
                           max_tokens_cap=int(self.cfg.sampling.max_tokens))
      uds = os.path.join(self.socket_dir, f"{name}.sock")
      if os.path.exists(uds):
        os.unlink(uds)
      self._proxies[name] = ProxyServer(EngineBackend(self.engine), self.tokenizer, config,
                                        port=None, uds=uds).start()
    return self._proxies[name]

  def update_params(self, params, version: int | None = None) -> int:
    """Weight sync: ``params`` is a device-side flat params dict (no host round trip)."""
    return self.engine.update_params(params, version=version)

  @property
  def params_version(self) -> int:
    return self.engine.params_version

  def close(self):
    for p in self._proxies.values():
      p.stop()
    self._proxies.clear()
    self.engine.stop()


def scripted_proxy(tokenizer, reply_fn, socket_dir: str, name: str = "scripted") -> ProxyServer:
  """A proxy whose policy is a Python function (scripted demonstrations)."""
  os.makedirs(socket_dir, exist_ok=True)
  uds = os.path.join(socket_dir, f"{name}.sock")
  if os.path.exists(uds):
    os.unlink(uds)
  return ProxyServer(ScriptedBackend(tokenizer, reply_fn), tokenizer, port=None, uds=uds).start()
