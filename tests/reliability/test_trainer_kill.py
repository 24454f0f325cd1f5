"""The learner SIGKILLed at random points (during start-up, right after a save or inside the
async save that follows), then resumed: after every kill the latest checkpoint restores, and
the final parameters equal an uninterrupted run's bit for bit (CPU, same seed, sync updates),
whether every parameter trains or only the top block or LoRA adapters (checkpoints of the
trainables, the frozen base rebuilt), and with the top block fed from the frozen-trunk cache
(rebuilt at every start, as SFT rebuilds it)."""

import pytest

from tests.reliability import killkit


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "top:1", "lora", "top:1+trunk_cache"])
def test_random_kills_then_resume_match_uninterrupted(tmp_path, trainable):
  o = killkit.trainer_kill(str(tmp_path), seed=1234, trainable=trainable)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
