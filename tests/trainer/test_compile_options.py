"""The learner's XLA compile options: applied to its jitted functions, same results as XLA's
defaults, and a bad value named at start."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from legorl_jax import errors
from legorl_jax.models import create_model
from legorl_jax.trainer import compile_options
from legorl_jax.trainer.learner import Learner
from tests.trainer.test_train_step import CFG, make_batch, make_cfg

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU option")


def _ynn_fusions(compiled_text: str) -> list[str]:
  return [line for line in compiled_text.splitlines() if "__ynn_fusion" in line]


def test_dot_only_keeps_reductions_and_elementwise_out_of_the_library():
  """With ``dot``, a norm-gradient-like reduction compiles to XLA's own fusions, and a matmul
  still goes to the library."""
  opts = compile_options.learner_compiler_options(make_cfg().trainer)
  assert opts == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
  x = jnp.ones((643, 512))
  reduce_fn = jax.jit(lambda x, g: jnp.sum(x * g, axis=0), compiler_options=opts)
  assert not _ynn_fusions(reduce_fn.lower(x, x).compile().as_text())
  dot_fn = jax.jit(lambda x, w: x @ w, compiler_options=opts)
  assert _ynn_fusions(dot_fn.lower(x, jnp.ones((512, 256))).compile().as_text())
  np.testing.assert_allclose(reduce_fn(x, x), jnp.sum(x * x, 0))


def test_learner_update_is_the_same_with_xla_defaults():
  """The option changes which kernels run, not the arithmetic the learner asks for."""
  learners = {}
  for choice in ("dot", "xla_default"):
    cfg = make_cfg(loss="grpo", micro=2)
    cfg.trainer.cpu_library_fusion = choice
    cfg.optim.eps = 1.0  # Adam update ~ lr * g: a near-zero gradient's rounding stays rounding-sized
    learners[choice] = Learner(create_model(CFG, seed=0), cfg)
  assert learners["xla_default"].compiler_options is None
  assert learners["dot"].compiler_options is not None
  batch = make_batch()
  m_dot = learners["dot"].update([batch])
  m_def = learners["xla_default"].update([batch])
  np.testing.assert_allclose(m_dot["loss/policy"], m_def["loss/policy"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m_dot["grad_norm"], m_def["grad_norm"], rtol=1e-5)
  p_dot, p_def = learners["dot"].params_copy(), learners["xla_default"].params_copy()
  for k in p_dot:
    np.testing.assert_allclose(np.asarray(p_dot[k]), np.asarray(p_def[k]), atol=1e-6)
  l_dot, _ = learners["dot"].logprobs(batch)
  l_def, _ = learners["xla_default"].logprobs(batch)
  np.testing.assert_allclose(np.asarray(l_dot), np.asarray(l_def), atol=1e-5)


def test_learner_step_compiles_with_the_option():
  learner = Learner(create_model(CFG, seed=0), make_cfg())
  batch = jax.tree.map(jnp.asarray, make_batch())
  text = learner._step.lower(learner.state, batch, scored_cap=None,
                             shared_prefix=None).compile().as_text()
  fusions = _ynn_fusions(text)
  assert fusions, "the matmuls should still run in the library"
  assert all("reduce" not in line.split("metadata=")[-1] for line in fusions)


def test_no_options_off_cpu_and_bad_value_named():
  assert compile_options.learner_compiler_options(make_cfg().trainer, backend="tpu") is None
  cfg = make_cfg()
  cfg.trainer.cpu_library_fusion = "all"
  with pytest.raises(errors.ConfigError, match="trainer.cpu_library_fusion='all'"):
    compile_options.learner_compiler_options(cfg.trainer)


def test_config_check_names_a_bad_value():
  from experiments.configs import demo_tiny as demo
  from legorl_jax.trainer import config_check
  cfg = demo.get_config()
  config_check.validate(cfg)
  cfg.trainer.cpu_library_fusion = "eltwise"
  with pytest.raises(errors.ConfigError, match="cpu_library_fusion"):
    config_check.validate(cfg)
