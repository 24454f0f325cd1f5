"""The learner SIGKILLed at random points (during start-up, right after a save or inside the
async save that follows), then resumed: after every kill the latest checkpoint restores, and
the final parameters equal an uninterrupted run's bit for bit (CPU, same seed, sync updates)."""

import pytest

from tests.reliability import faultkit


@pytest.mark.slow
def test_random_kills_then_resume_match_uninterrupted(tmp_path):
  o = faultkit.trainer_kill(str(tmp_path), seed=1234)
  assert o.ok, f"{o.detail}; left running: {o.leaked}"
