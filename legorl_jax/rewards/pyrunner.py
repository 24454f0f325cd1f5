"""A plain-Python test runner: the cheap verifier of synthetic tasks.

Standalone and stdlib-only, because it is copied into the sandbox and run by whatever
``python3`` is there. It imports each test file, runs its ``test_*`` functions (and
``test_*`` methods of ``Test*`` classes), and writes one JSON object:

  {"tests": {"tests/test_x.py::test_y": {"outcome": "passed"|"failed"|"error", "message": str}},
   "duration_s": float}

Test ids follow pytest's ``file::[Class::]name`` form so task lists work with either
runner. Exit code: 0 when every test passed, 1 otherwise, 2 on a usage error. One
interpreter start plus imports: tens of milliseconds, where starting pytest costs ~0.4 s.

  python3 pyrunner.py --root REPO --out results.json [--per-test-timeout S] tests/test_a.py ...
"""

import importlib.util
import json
import os
import signal
import sys
import time


class _TestTimeout(BaseException):
  pass


def _alarm(signum, frame):
  raise _TestTimeout()


def _run_one(fn, per_test_timeout):
  if per_test_timeout > 0:
    signal.setitimer(signal.ITIMER_REAL, per_test_timeout)
  try:
    fn()
    return "passed", ""
  except AssertionError as e:
    return "failed", _short(e)
  except _TestTimeout:
    return "failed", f"timed out after {per_test_timeout}s"
  except (Exception, SystemExit) as e:  # noqa: BLE001 - any exception is a test error
    return "error", _short(e)
  finally:
    if per_test_timeout > 0:
      signal.setitimer(signal.ITIMER_REAL, 0)


def _short(e):
  import traceback  # only on failures: keeps the common path's start-up short
  tb = traceback.format_exception(type(e), e, e.__traceback__)
  return "".join(tb[-3:])[-2000:]


def _load(root, rel):
  path = os.path.join(root, rel)
  name = "_legorl_test_" + rel.replace("/", "_").replace(".", "_")
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None:
    raise ImportError(f"cannot import {rel}")
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod
  spec.loader.exec_module(mod)
  return mod


def _collect(mod, rel):
  items = []
  for name, obj in list(vars(mod).items()):
    if name.startswith("test") and callable(obj) and not isinstance(obj, type):
      if getattr(obj, "__module__", None) == mod.__name__:
        items.append((f"{rel}::{name}", obj))
    elif name.startswith("Test") and isinstance(obj, type):
      for mname in sorted(vars(obj)):
        if mname.startswith("test") and callable(getattr(obj, mname)):
          def call(cls=obj, m=mname):
            inst = cls()
            if hasattr(inst, "setup_method"):
              inst.setup_method(getattr(inst, m))
            getattr(inst, m)()
          items.append((f"{rel}::{name}::{mname}", call))
  return items


def _parse(argv):
  """--root DIR --out FILE [--per-test-timeout S] FILE... (no argparse: it costs start-up)."""
  opts = {"--root": ".", "--out": None, "--per-test-timeout": "10"}
  files, i = [], 0
  while i < len(argv):
    if argv[i] in opts:
      if i + 1 >= len(argv):
        raise SystemExit(f"pyrunner: {argv[i]} needs a value")
      opts[argv[i]] = argv[i + 1]
      i += 2
    else:
      files.append(argv[i])
      i += 1
  if opts["--out"] is None or not files:
    sys.stderr.write(__doc__.strip().splitlines()[-1] + "\n")
    raise SystemExit(2)
  return opts["--root"], opts["--out"], float(opts["--per-test-timeout"]), files


def main(argv=None):
  root, out, per_test_timeout, files = _parse(sys.argv[1:] if argv is None else argv)
  t0 = time.perf_counter()
  root = os.path.abspath(root)
  sys.path.insert(0, root)
  os.chdir(root)
  signal.signal(signal.SIGALRM, _alarm)
  results = {}
  for rel in files:
    try:
      mod = _load(root, rel)
    except BaseException as e:  # noqa: BLE001 - a broken module fails its file, not the run
      if isinstance(e, KeyboardInterrupt):
        raise
      results[f"{rel}::<module>"] = {"outcome": "error", "message": _short(e)}
      continue
    for test_id, fn in _collect(mod, rel):
      outcome, message = _run_one(fn, per_test_timeout)
      results[test_id] = {"outcome": outcome, "message": message}
  payload = {"tests": results, "duration_s": time.perf_counter() - t0}
  with open(out, "w", encoding="utf-8") as f:
    json.dump(payload, f)
  ok = bool(results) and all(r["outcome"] == "passed" for r in results.values())
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
