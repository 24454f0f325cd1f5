"""The whole training pipeline (``python -m experiments.train``: rollouts through the built-in
harness in bwrap sandboxes, proxy, engine, GRPO updates, orbax checkpoints) SIGKILLed while a
step runs, then rerun with the same workdir: it ends exactly where an uninterrupted run ends.

What happens to the trials of the step that was cut: its directory is renamed
``rollouts/step_NNNNN.interrupted`` and each of its trials is appended to ``trials.jsonl``
with ``phase="rl_interrupted"`` (the ones that finished with their status, the ones that
were running as ``harness_error``), all with ``interrupted: true``; the step then runs again
from its checkpointed start and its trials are recorded with ``phase="rl"`` as usual.
"""

import pytest

from tests.reliability import killkit


@pytest.mark.slow
def test_pipeline_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path):
  o = killkit.pipeline_kill(str(tmp_path), steps=2, kill_after=1)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
  assert o.lost == 0
  assert len(o.final) == 2 * 8  # each step's 2 tasks x 4 samples, once


@pytest.mark.slow
def test_moe_pipeline_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path):
  """The same with a mixture-of-experts policy (``demo_tiny_moe.py``: the engine records routes,
  the learner replays them): the resumed run's parameters, metrics and sampled tokens equal the
  uninterrupted run's.

  At the suite's LLVM -O0 compiles, not XLA's default level as the dense case: at the default
  level this policy's two runs sampled different tokens already in step 1, before any kill (2 of
  5 runs, 2026-12-04), so its sampling there depends on timing, i.e. on which rows share a
  batch. The cause is not found yet: ``moe.blocked_experts`` alone gives a token the same output
  bit for bit among 50 random batches at both levels."""
  o = killkit.pipeline_kill(str(tmp_path), steps=2, kill_after=1,
                             config="experiments/configs/demo_tiny_moe.py",
                             xla_default_compile=False)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
  assert o.lost == 0
  assert len(o.final) == 2 * 8
