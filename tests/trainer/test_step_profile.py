"""StepProfile against each thread's own clock and the engine counters it was handed."""

import sys
import threading
import time

import pytest

from legorl_jax.trainer.step_profile import StepProfile

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _burn_in_thread(name: str, seconds: float):
  """Starts a thread called ``name`` that spins for ``seconds`` of its own CPU, then waits on the
  returned gate (the profile reads live threads); returns (its CPU seconds, thread, gate)."""
  out, gate = [], threading.Event()

  def burn():
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
      pass
    out.append(time.thread_time() - t0)
    gate.wait()

  t = threading.Thread(target=burn, name=name)
  t.start()
  while not out:
    time.sleep(0.01)
  return out[0], t, gate


def test_rollout_and_update_figures_come_from_their_own_interval():
  counters = {"prefill_s": 1.0, "decode_s": 2.0, "decode_row_steps": 100, "live_row_steps": 40,
              "decoded_tokens": 30, "prefill_tokens": 500, "decode_calls": 10,
              "shared_prefix_calls": 2, "compilations": {"prefill": 2, "decode": 3}}
  prof = StepProfile(lambda: dict(counters))
  prof.start()
  sampler_cpu, t1, gate1 = _burn_in_thread("legorl-sampler", 0.3)
  counters.update(prefill_s=1.1, decode_s=2.2, decode_row_steps=180, live_row_steps=100,
                  decoded_tokens=90, decode_calls=14, shared_prefix_calls=5,
                  compilations={"prefill": 2, "decode": 4})
  prof.rollout_done()
  gate1.set()
  t1.join()
  learner_cpu, t2, gate2 = _burn_in_thread("learner_7", 0.2)
  counters.update(decode_s=9.0)  # after the rollout: must not count
  m = prof.update_done()
  gate2.set()
  t2.join()

  tick = 0.02  # /proc counts clock ticks; allow two
  assert m["rollout_cpu/legorl-sampler"] == pytest.approx(sampler_cpu, abs=tick)
  assert "rollout_cpu/learner" not in m  # it ran in the update
  assert m["engine_prefill_s"] == pytest.approx(0.1) and m["engine_decode_s"] == pytest.approx(0.2)
  assert m["engine_live_row_frac"] == pytest.approx(60 / 80)
  assert m["engine_decode_tokens_per_s"] == pytest.approx(60 / 0.2)
  assert m["engine_decode_calls"] == 4 and m["engine_shared_prefix_frac"] == pytest.approx(3 / 4)
  assert m["engine_compiled"] == 1
  # The rollout lasted at least the sampler's 0.3 CPU-seconds; its wall is 0.3 s / busy share.
  assert 0 < m["engine_busy_frac"] <= 1.0
  rollout_wall = 0.3 / m["engine_busy_frac"]
  # Each part's process CPU (cores busy x wall) holds at least the thread that burned in it.
  assert m["cores_busy_rollout"] * rollout_wall >= sampler_cpu - tick
  assert m["update_wall_s"] >= learner_cpu - tick
  assert m["cores_busy_update"] * m["update_wall_s"] >= learner_cpu - tick
  step_cpu = m["cores_busy_rollout"] * rollout_wall + m["cores_busy_update"] * m["update_wall_s"]
  assert m["cores_busy_step"] * (rollout_wall + m["update_wall_s"]) == pytest.approx(step_cpu,
                                                                                      abs=2 * tick)
  line = StepProfile.summary(m)
  assert "legorl-sampler" in line and "cores busy rollout" in line


def test_a_failing_engine_counter_does_not_fail_the_step():
  def broken():
    raise RuntimeError("engine gone")

  prof = StepProfile(broken)
  prof.start()
  prof.rollout_done()
  m = prof.update_done()
  assert m["engine_busy_frac"] == 0.0 and "engine_live_row_frac" not in m


def test_update_done_before_the_rollout_is_an_error():
  prof = StepProfile(dict)
  with pytest.raises(RuntimeError, match="before start"):
    prof.update_done()
