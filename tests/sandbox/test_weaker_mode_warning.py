"""Without bubblewrap the weaker-mode warning holds for the whole process: logged once, not
once per sandbox (a demo makes a sandbox per trial)."""

import logging

from legorl_jax.sandbox import SandboxConfig, create_sandbox, local
from legorl_jax.tasks.schema import Task
from legorl_jax.utils import log_once


def _task(tmp_path) -> Task:
  src = tmp_path / "src"
  src.mkdir()
  (src / "m.py").write_text("X = 1\n")
  return Task.from_dict({"id": "weaker", "repo": {"type": "dir", "path": str(src)},
                         "instruction": "x", "hidden_tests": {"tests/test_h.py": "def test(): pass\n"},
                         "FAIL_TO_PASS": ["tests/test_h.py::test"]})


def test_the_weaker_mode_warning_is_logged_once_for_several_sandboxes(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(local, "bwrap_path", lambda: None)
  log_once.forget(local.WEAKER_MODE_KEY)
  task = _task(tmp_path)
  config = SandboxConfig(backend="local", base_dir=str(tmp_path / "sandboxes"))
  with caplog.at_level(logging.WARNING, logger=local.log.name):
    for _ in range(3):
      sb = create_sandbox(task, config)
      try:
        assert not sb.isolated and sb.exec("cat m.py").stdout.strip() == b"X = 1"
      finally:
        sb.destroy()
  warned = [r for r in caplog.records if "bubblewrap not found" in r.getMessage()]
  assert len(warned) == 1, [r.getMessage() for r in warned]
  log_once.forget(local.WEAKER_MODE_KEY)


def test_log_once_logs_a_key_once_and_again_after_forget(caplog):
  logger = logging.getLogger("legorl_jax.tests.log_once")
  key = "tests.log_once.key"
  log_once.forget(key)
  with caplog.at_level(logging.WARNING, logger=logger.name):
    assert log_once.warning(logger, key, "x %d", 1)
    assert not log_once.warning(logger, key, "x %d", 2)
    log_once.forget(key)
    assert log_once.warning(logger, key, "x %d", 3)
  assert [r.getMessage() for r in caplog.records] == ["x 1", "x 3"]
  log_once.forget(key)
