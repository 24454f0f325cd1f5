"""thread_cpu against each thread's and child's own clock (``time.thread_time``,
``time.process_time`` printed by the child)."""

import subprocess
import sys
import threading
import time

import pytest

from legorl_jax.utils import thread_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _burn(seconds: float, out: list):
  t0 = time.thread_time()
  x = 0
  while time.thread_time() - t0 < seconds:
    x += 1
  out.append(time.thread_time() - t0)


@pytest.mark.parametrize("name,cls", [("legorl-trial_12", "legorl-trial"),
                                      ("Thread-7 (process_request_thread)",
                                       "Thread_process_request_thread"),
                                      ("llvm-worker-1", "llvm-worker"),
                                      ("tf_XLAEigen", "tf_XLAEigen"), ("123", "unnamed")])
def test_thread_class_drops_numbers_and_unsafe_characters(name, cls):
  assert thread_cpu.thread_class(name) == cls


def test_breakdown_names_live_threads_exited_threads_and_children():
  live_done, exited_done = [], []
  gate = threading.Event()

  def live():
    _burn(0.3, live_done)
    gate.wait()

  a = thread_cpu.CpuSnapshot.take()
  t_live = threading.Thread(target=live, name="probe-live_3")
  t_live.start()
  t_exit = threading.Thread(target=_burn, args=(0.3, exited_done), name="probe-exit_4")
  t_exit.start()
  t_exit.join()
  child = subprocess.run([sys.executable, "-c",
                          "import time\nt=time.process_time()\n"
                          "while time.process_time()-t<0.3: pass\nprint(time.process_time())"],
                         capture_output=True, text=True, check=True)
  while not live_done:
    time.sleep(0.01)
  b = thread_cpu.CpuSnapshot.take()
  gate.set()
  t_live.join()
  parts = thread_cpu.breakdown(a, b)

  tick = 2.0 / 100  # /proc counts in clock ticks; allow two
  assert parts["thread/probe-live"] == pytest.approx(live_done[0], abs=tick)
  assert "thread/probe-exit" not in parts  # gone before the second snapshot
  assert parts["exited_threads"] >= exited_done[0] - tick
  child_cpu = float(child.stdout)
  assert child_cpu - tick <= parts["children"] <= child_cpu + 0.5  # + interpreter start-up
  assert parts["wall_s"] > 0.6
  busy = sum(v for k, v in parts.items() if k not in ("wall_s", "cores_busy", "other_processes"))
  assert parts["cores_busy"] == pytest.approx(busy / parts["wall_s"], abs=tick)
  if "other_processes" in parts:
    assert parts["other_processes"] >= 0.0
  assert "probe-live" in thread_cpu.top(parts)
