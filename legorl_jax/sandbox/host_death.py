"""Sandbox commands that die with the process that started them, with no window in between.

A local sandbox command runs in a session of its own, so that a timeout can kill its whole
process group; that also keeps it out of the host's group, so when the host is SIGKILLed (the
OOM killer, a preemption, ``kill -9`` of a training run) a group kill does not reach it.
bubblewrap's ``--die-with-parent`` asks the kernel to SIGKILL the command when its parent dies,
but only from the moment bwrap itself runs. A host that dies between the fork and that moment
leaves the command running as an orphan: seen on 2026-12-06, a bwrap still alive 10 s after its
training process was killed while a trial's verifier was starting (the pipeline kill test).

``die_with_host_argv`` closes the window. ``setpriv --pdeathsig KILL`` (util-linux) arms the
parent-death signal first; the kernel keeps it across the ``exec``s that follow, none of which
changes credentials. Then a shell checks that its parent is still the host, exits 137 if the host
is already gone, and only then ``exec``s the command, keeping the same pid (so a timeout's group
kill and the exit status work as before).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil

from legorl_jax.utils import log_once

log = logging.getLogger(__name__)
NO_SETPRIV_KEY = "sandbox.host_death.no_setpriv"  # the once-per-process warning
CHECK_NAME = "legorl-host-check"  # $0 of the checking shell (shows in ps)


def die_with_host_argv(host_pid: int | None = None) -> list[str]:
  """The argv prefix that makes a command die with ``host_pid`` (default: this process).

  Must be exec'd by a direct child of ``host_pid``: the shell compares its parent's pid with it.
  Without ``setpriv`` (util-linux before 2.33, or none) the prefix is empty and only bwrap's own
  ``--die-with-parent`` applies, with its window; that is logged once per process.
  """
  setpriv = _setpriv()
  if setpriv is None:
    log_once.warning(log, NO_SETPRIV_KEY, "setpriv (util-linux) not found: a sandbox command "
                     "started just as its process is killed may outlive it; install util-linux")
    return []
  pid = os.getpid() if host_pid is None else int(host_pid)
  return [setpriv, "--pdeathsig", "KILL", "--", "/bin/sh", "-c",
          f'[ "$PPID" = {pid} ] || exit 137; exec "$@"', CHECK_NAME]


@functools.cache
def _setpriv() -> str | None:
  """setpriv's path, looked up once per process (this runs for every sandbox command)."""
  return shutil.which("setpriv")
