"""The whole training pipeline (``python -m experiments.train``: rollouts through the built-in
harness in bwrap sandboxes, proxy, engine, GRPO updates, orbax checkpoints) SIGKILLed while a
step runs, then rerun with the same workdir: it ends exactly where an uninterrupted run ends.

What happens to the trials of the step that was cut: its directory is renamed
``rollouts/step_NNNNN.interrupted`` and each of its trials is appended to ``trials.jsonl``
with ``phase="rl_interrupted"`` (the ones that finished with their status, the ones that
were running as ``harness_error``), all with ``interrupted: true``; the step then runs again
from its checkpointed start and its trials are recorded with ``phase="rl"`` as usual.

The mixture-of-experts case is in ``test_pipeline_kill_moe.py`` (a file of its own, so that the
two long runs can go to two test workers).
"""

import pytest

from tests.reliability import killkit


@pytest.mark.slow
def test_pipeline_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path):
  o = killkit.pipeline_kill(str(tmp_path), steps=2, kill_after=1)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
  assert o.lost == 0
  assert len(o.final) == 2 * 8  # each step's 2 tasks x 4 samples, once
