"""PhaseProgress: the banner, n/N, the ETA from the observed rate, and the closing line."""

import threading

from legorl_jax.metrics.progress import PhaseProgress


class _Clock:
  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_banner_lines_eta_and_finish():
  lines, clock = [], _Clock()
  p = PhaseProgress("sft", 4, emit=lines.append, clock=clock)
  for _ in range(4):
    clock.t += 30
    p.step("nll 1.0")
  p.finish("final nll 1.0")
  assert lines == ["== sft: 4 steps ==",
                   "[sft 1/4  25% | 0:30, ETA 1:30] nll 1.0",
                   "[sft 2/4  50% | 1:00, ETA 1:00] nll 1.0",
                   "[sft 3/4  75% | 1:30, ETA 0:30] nll 1.0",
                   "[sft 4/4 100% | 2:00] nll 1.0",
                   "== sft done: 4/4 steps in 2:00; final nll 1.0 =="]


def test_the_eta_leaves_the_first_items_one_off_costs_out():
  """A first SFT step that compiles and fills the trunk cache (120 s) before 30 s steps: from the
  second step on the ETA is the steady steps' rate."""
  lines, clock = [], _Clock()
  p = PhaseProgress("sft", 10, emit=lines.append, clock=clock)
  clock.t += 120
  p.step()
  for _ in range(2):
    clock.t += 30
    p.step()
  assert lines[1:] == ["[sft 1/10  10% | 2:00, ETA 18:00]",
                       "[sft 2/10  20% | 2:30, ETA 4:00]",
                       "[sft 3/10  30% | 3:00, ETA 3:30]"]


def test_a_resumed_phase_estimates_from_the_items_done_since():
  lines, clock = [], _Clock()
  p = PhaseProgress("rl", 10, done=6, emit=lines.append, clock=clock)
  clock.t += 3600
  p.step(done=7, force=True)
  assert lines == ["== rl: 10 steps, resuming at 6 ==", "[rl 7/10  70% | 1:00:00, ETA 3:00:00]"]


def test_every_thins_the_lines_but_keeps_the_last_and_threads_count_each_item():
  lines = []
  p = PhaseProgress("eval", 40, unit="trials", every=10, emit=lines.append, clock=_Clock())
  workers = [threading.Thread(target=lambda: [p.step() for _ in range(10)]) for _ in range(4)]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  assert p.done == 40 and len(lines) == 1 + 4 and lines[-1].startswith("[eval 40/40 100%")
  assert p.finish(done=40) == "== eval done: 40/40 trials in 0:00 =="
