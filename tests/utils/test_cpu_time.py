"""process_tree_cpu_s against the CPU time children report for themselves."""

import subprocess
import sys

from legorl_jax.utils import cpu_time

_BURN = ("import time\n"
         "t = time.process_time()\n"
         "while time.process_time() - t < {secs}:\n"
         "  sum(range(1000))\n"
         "print(time.process_time())\n")


def test_reaped_children_count_and_running_ones_do_not():
  before = cpu_time.process_tree_cpu_s()
  out = subprocess.run([sys.executable, "-c", _BURN.format(secs=0.3)], capture_output=True,
                       text=True, check=True)
  child_says = float(out.stdout)
  after = cpu_time.process_tree_cpu_s()
  # The child's whole CPU time (interpreter start included) is at least what it measured itself.
  assert after - before >= child_says - 0.02
  assert after - before < child_says + 2.0  # and not wildly more: only this child ran

  proc = subprocess.Popen([sys.executable, "-c", _BURN.format(secs=0.3)], stdout=subprocess.PIPE,
                          text=True)
  proc.stdout.read()  # the child has burnt its CPU time but is not reaped yet
  mid = cpu_time.process_tree_cpu_s()
  proc.wait()
  end = cpu_time.process_tree_cpu_s()
  assert mid - after < 0.1  # not counted before it is reaped
  assert end - mid >= 0.28
