"""Fixtures for the fault-injection tests: a real proxy serving ``faultkit.FaultPolicy`` (the
scripted fix, plus a fault hook armed per test), and the Docker engine check."""

import pytest

from legorl_jax.models.tokenizer import load_tokenizer
from legorl_jax.proxy import ProxyConfig, ScriptedBackend
from legorl_jax.taskgen.synthetic import generate_tasks
from tests.harnesses.conftest import start_proxy, stop_proxy
from tests.reliability import faultkit


@pytest.fixture(scope="session")
def fault_env(tmp_path_factory):
  tasks = generate_tasks(2, seed=21, difficulty="easy")
  tok = load_tokenizer()
  policy = faultkit.FaultPolicy(tasks)
  proxy = start_proxy(ScriptedBackend(tok, policy.reply), tok, ProxyConfig(model_name="policy"))
  yield faultkit.FaultEnv(tasks, proxy, policy, str(tmp_path_factory.mktemp("faults")))
  stop_proxy(proxy)


@pytest.fixture
def docker_engine():
  if faultkit.docker_client() is None:
    pytest.skip("no Docker engine (`bash .ci/setup_system.sh` starts one)")


@pytest.fixture(scope="session")
def tiny_engine():
  """The random ``tiny`` policy in a real ``Engine`` behind a proxy: namespace(engine, proxy)."""
  import types

  from legorl_jax.models import create_model, get_preset
  from legorl_jax.proxy import EngineBackend
  from legorl_jax.sampling import Engine

  tok = load_tokenizer()
  model = create_model(get_preset("tiny").replace(max_position_embeddings=4096), seed=0)
  engine = Engine(model, max_batch=2, max_len=4096, prefill_buckets=(512, 2048),
                  prefill_rows=(1,), decode_rows=(2,), attn_buckets=(2048, 4096), decode_chunk=16,
                  seed=0, decode_fn=tok).start()
  proxy = start_proxy(EngineBackend(engine), tok,
                      ProxyConfig(model_name="policy", force_temperature=1.0, max_tokens_cap=32))
  yield types.SimpleNamespace(engine=engine, proxy=proxy)
  stop_proxy(proxy)
  engine.stop()
