"""The `transformers` reference shared by the HF checkpoint tests (dense and MoE).

One place for how a reference checkpoint is made and how both sides are run, so the dense and
MoE tests cannot drift apart in seeding, attention implementation or dtype. Import it only after
``pytest.importorskip("torch")`` / ``("transformers")``: it needs both.
"""

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx


def torch_logits(model, ids) -> np.ndarray:
  """fp32 logits of a `transformers` causal LM on ``ids`` [batch, seq] (the reference side)."""
  with torch.no_grad():
    return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


def jax_logits(model, ids) -> np.ndarray:
  """Logits of one of our nnx models on ``ids``, jitted as the trainer runs it."""
  graphdef, state = nnx.split(model)
  return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, jnp.asarray(ids)))


def checkpoint_cache(tmp_path_factory, prefix, configs, ids, perturb, save_kwargs=None):
  """A ``name -> (checkpoint dir, reference logits on ids)`` getter, each written once.

  ``configs[name]()`` builds the HF config. The model is seeded random (eager attention, so the
  reference does not depend on which kernels torch picks), then ``perturb(param_name, param)``
  runs on every parameter under ``no_grad`` to move norms, biases or routers off their trivial
  init, so that loading them wrongly shows in the logits. ``save_kwargs(name)`` adds arguments
  to ``save_pretrained`` (e.g. ``max_shard_size`` to force a sharded checkpoint).
  """
  cache = {}

  def get(name):
    if name not in cache:
      torch.manual_seed(0)
      model = transformers.AutoModelForCausalLM.from_config(
          configs[name](), attn_implementation="eager").eval()
      with torch.no_grad():
        for param_name, p in model.named_parameters():
          perturb(param_name, p)
      path = tmp_path_factory.mktemp(f"{prefix}_{name}")
      model.save_pretrained(path, **(save_kwargs(name) if save_kwargs else {}))
      cache[name] = path, torch_logits(model, ids)
    return cache[name]

  return get
