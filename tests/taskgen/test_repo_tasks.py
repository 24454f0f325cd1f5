"""Tasks built from a real project's own test suite (``legorl_jax.taskgen.repo``).

The fixture project (``repo_fixture``) is built once on the local bubblewrap backend with
the test interpreter mounted read-only (its pytest is the "dependencies installed on the
host"). Every invariant is then checked independently of the builder and the verifier: the
shipped archive is unpacked with tarfile, the hidden tests are written in and run with this
interpreter's pytest, and the gold patch is applied with `git apply`.
"""

import ast
import io
import os
import re
import subprocess
import sys
import tarfile

import pytest

from legorl_jax.errors import TaskError
from legorl_jax.sandbox import SandboxConfig
from legorl_jax.tasks.jsonl import load_tasks_jsonl
from legorl_jax.taskgen.repo import BuildConfig, build_tasks, env_spec, instruction, mutate
from tests.taskgen import repo_fixture

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap")

# A venv's python is a link into its base interpreter's prefix: mount both.
SANDBOX = SandboxConfig(backend="local", ro_mounts=tuple(dict.fromkeys((sys.prefix, sys.base_prefix))),
                        env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
CONFIG = BuildConfig(sandbox=SANDBOX, max_mutations=24, max_tasks=8, max_per_function=1, seed=3,
                     time_budget_s=240.0)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  root = tmp_path_factory.mktemp("repo_tasks")
  project = repo_fixture.write(str(root / "tallykit"))
  out = str(root / "tasks.jsonl")
  report = build_tasks(project, out, CONFIG, tfds_dir=str(root / "tasks.tfds"))
  tasks, errors = load_tasks_jsonl(out)
  assert not errors
  return report, tasks, root


def _unpack(task, dest):
  with tarfile.open(fileobj=io.BytesIO(task.repo.data)) as tf:
    tf.extractall(dest, filter="data")
  return dest


def _run_pytest(cwd, files):
  """{test id: outcome} from this interpreter's pytest (the reference runner)."""
  p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir=.",
                      *files], cwd=cwd, capture_output=True, text=True,
                     env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"})
  out = {}
  for line in p.stdout.splitlines():
    m = re.match(r"^(PASSED|FAILED|ERROR) (\S+)", line)
    if m:
      out[m.group(2)] = m.group(1).lower()
  return out


def test_builds_valid_tasks_with_the_reported_counts(built):
  report, tasks, _ = built
  assert report.baseline_tests == report.baseline_passing == 15
  assert len(tasks) == report.tasks >= 4
  assert report.mutations_tried <= CONFIG.max_mutations and report.kept <= CONFIG.max_tasks
  assert len(report.verifier_s) == len(tasks) and all(s > 0 for s in report.verifier_s)
  assert len({t.instruction for t in tasks}) == len(tasks)
  assert len({t.metadata.extra["function"] for t in tasks}) == len(tasks)  # max_per_function=1
  for t in tasks:
    assert t.verifier.kind == "pytest" and t.image is None and t.metadata.extra["verifier_s"] > 0
    assert t.metadata.extra["family"] in (
        "wrong_operator", "off_by_one", "wrong_constant", "swapped_arguments", "missing_edge_case",
        "wrong_return", *mutate.EXTRA_FAMILIES)


def test_each_mutation_breaks_some_passing_tests_and_keeps_the_rest(built, tmp_path):
  report, tasks, _ = built
  clean = repo_fixture.write(str(tmp_path / "clean"))
  every = set(_run_pytest(clean, ["tests"]))
  assert len(every) == 15 and set(_run_pytest(clean, ["tests"]).values()) == {"passed"}
  for i, task in enumerate(tasks):
    assert set(task.fail_to_pass) | set(task.pass_to_pass) == every and task.fail_to_pass
    assert not set(task.fail_to_pass) & set(task.pass_to_pass)
    repo = _unpack(task, str(tmp_path / f"t{i}"))
    for path in task.hidden_tests:
      assert not os.path.exists(os.path.join(repo, path)), "hidden tests must not ship"
      assert {tid.split("::")[0] for tid in task.fail_to_pass} <= set(task.hidden_tests)
    for path, text in task.hidden_tests.items():
      with open(os.path.join(repo, path), "w") as f:
        f.write(text)
    before = _run_pytest(repo, ["tests"])
    assert {t for t, o in before.items() if o != "passed"} == set(task.fail_to_pass), task.id
    assert {t for t, o in before.items() if o == "passed"} == set(task.pass_to_pass), task.id
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    p = subprocess.run(["git", "apply", "-"], cwd=repo, input=task.gold_patch, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr
    after = _run_pytest(repo, ["tests"])
    assert set(after) == every and set(after.values()) == {"passed"}, task.id
    # The gold patch restores the original file exactly (it is the mutation's inverse).
    rel = task.metadata.extra["file"]
    assert open(os.path.join(repo, rel)).read() == repo_fixture.FILES[rel]


def test_instructions_leak_neither_the_fix_location_nor_the_test_source(built):
  _, tasks, _ = built
  test_lines = {l.strip() for rel, text in repo_fixture.FILES.items() if rel.startswith("tests/")
                for l in text.splitlines() if len(l.strip()) >= 12}
  for t in tasks:
    extra = t.metadata.extra
    func = extra["function"].split(".")[-1]
    assert not re.search(rf"(?<![A-Za-z0-9_]){re.escape(func)}(?![A-Za-z0-9_])", t.instruction), t.instruction
    assert extra["file"] not in t.instruction and extra["file"].removesuffix(".py") not in t.instruction
    for line in (extra["bug_new"], extra["bug_old"]):
      assert not line.strip() or line.strip() not in t.instruction
    assert not any(l in t.instruction for l in test_lines), t.instruction
    assert "started failing" in t.instruction
    # The instruction names at least one failing test.
    assert any(tid.split("::", 1)[1] in t.instruction for tid in t.fail_to_pass)


def test_eval_loader_takes_the_file(built):
  from experiments.eval import load_tasks
  report, tasks, root = built
  loaded = load_tasks(str(root / "tasks.jsonl"))
  assert [t.id for t in loaded] == [t.id for t in tasks]


def test_tfds_dataset_splits_share_no_function(built):
  from legorl_jax.tasks.tfds_builder import open_task_source, record_to_task
  report, tasks, root = built
  by_split = {}
  for t in tasks:
    by_split.setdefault(t.metadata.extra["split"], set()).add(t.id)
  got, funcs = {}, {}
  for split in by_split:
    source = open_task_source(report.tfds_dir, split)
    ts = [record_to_task(source[i]) for i in range(len(source))]
    got[split] = {t.id for t in ts}
    funcs[split] = {(t.metadata.extra["file"], t.metadata.extra["function"]) for t in ts}
    assert all(t.repo.data and t.gold_patch and t.hidden_tests for t in ts)
  assert got == by_split
  if len(funcs) == 2:
    assert not funcs["train"] & funcs["validation"]


def test_environment_spec_discovery(tmp_path):
  root = repo_fixture.write(str(tmp_path / "p"))
  spec = env_spec.discover(root)
  assert spec.test_paths == ("tests",) and "pytest" in spec.requirements
  assert spec.install_command == "python3 -m pip install -e . pytest"
  assert "--rootdir=." in spec.pytest_args
  # A src layout puts src/ on sys.path; a test extra is installed with the project.
  files = {k.replace("tallykit/", "src/tallykit/"): v for k, v in repo_fixture.FILES.items()}
  files["pyproject.toml"] = files["pyproject.toml"].replace(
      "[tool.pytest", '[project.optional-dependencies]\ntest = ["hypothesis"]\n\n[tool.pytest')
  spec = env_spec.discover(repo_fixture.write(str(tmp_path / "q"), files))
  assert spec.extras == ("test",) and ("-o", "pythonpath=src") == spec.pytest_args[1:3]


def test_mutations_cover_methods_and_never_touch_strings():
  sites = mutate.functions_of(repo_fixture.TEXT, "tallykit/text.py")
  assert {s.qualname for s in sites} == {"Tally.__init__", "Tally.add", "Tally.top", "split_words", "abbreviate"}
  families = set()
  for s in mutate.functions_of(repo_fixture.STATS, "tallykit/stats.py"):
    for m in mutate.mutations_of(repo_fixture.STATS, s):
      families.add(m.family)
      mutated = m.apply(repo_fixture.STATS)
      assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(repo_fixture.STATS))
      assert '"""' not in m.old and "ValueError(\"" not in m.new.replace(m.old, "")
  assert {"wrong_operator", "off_by_one", "removed_statement", "missing_edge_case"} <= families


def test_instruction_drops_lines_that_name_the_function():
  text = instruction.make_instruction(
      "tallykit", [("tests/test_text.py::test_initial_letters",
                    "AssertionError: assert 'A' == 'AL'\n +  where 'A' = abbreviate('ada  lovelace')")],
      path="tallykit/text.py", qualname="abbreviate", test_sources={})
  assert "test_initial_letters" in text and "assert 'A' == 'AL'" in text and "abbreviate" not in text
  # A one-module project named like its main function still gets instructions (naming the
  # project is unavoidable); its file path stays out.
  text = instruction.make_instruction("parse", [("tests/test_parse.py::test_no_match", "assert None == 3")],
                                      path="parse.py", qualname="parse", test_sources={})
  assert text.startswith("parse: 1 test started failing") and "parse.py" not in text
  # A test whose own name is the function cannot be named: no instruction.
  assert instruction.make_instruction("tallykit", [("tests/t.py::abbreviate", "x")], path="tallykit/text.py",
                                      qualname="abbreviate", test_sources={}) is None


def _assert_nothing_written(root, out):
  assert not os.path.exists(out)
  assert not [f for f in os.listdir(root) if f.endswith(".part")]


def test_bad_input_no_tests(tmp_path):
  files = {k: v for k, v in repo_fixture.FILES.items() if not k.startswith("tests/")}
  out = str(tmp_path / "t.jsonl")
  with pytest.raises(TaskError, match="no tests found"):
    build_tasks(repo_fixture.write(str(tmp_path / "p"), files), out, CONFIG)
  _assert_nothing_written(tmp_path, out)


def test_bad_input_sdist_without_tests(tmp_path):
  files = {k: v for k, v in repo_fixture.FILES.items() if not k.startswith("tests/")}
  files["PKG-INFO"] = "Metadata-Version: 2.1\nName: tallykit\nVersion: 0.3.0\n"
  out = str(tmp_path / "t.jsonl")
  with pytest.raises(TaskError, match="no tests found.*sdists leave the tests out"):
    build_tasks(repo_fixture.sdist(str(tmp_path / "tallykit-0.3.0.tar.gz"), files), out, CONFIG)
  _assert_nothing_written(tmp_path, out)


def test_bad_input_suite_failing_before_any_mutation(tmp_path):
  files = dict(repo_fixture.FILES)
  files["tests/test_stats.py"] += "\n\ndef test_already_broken():\n    assert mean([2, 4]) == 5\n"
  out = str(tmp_path / "t.jsonl")
  with pytest.raises(TaskError, match=r"fails before any mutation: 1 of 16 tests fail.*test_already_broken"):
    build_tasks(repo_fixture.write(str(tmp_path / "p"), files), out, CONFIG)
  _assert_nothing_written(tmp_path, out)
  # Collection errors (the suite does not run at all) are named as such.
  files["tests/test_text.py"] = "import tallykit.missing_module\n" + files["tests/test_text.py"]
  with pytest.raises(TaskError, match="fails before any mutation.*collection"):
    build_tasks(repo_fixture.write(str(tmp_path / "q"), files), out, CONFIG)
  _assert_nothing_written(tmp_path, out)


def test_bad_input_build_error(tmp_path):
  files = dict(repo_fixture.FILES)
  files["pyproject.toml"] = files["pyproject.toml"].replace('name = "tallykit"', 'name = tallykit')
  out = str(tmp_path / "t.jsonl")
  with pytest.raises(TaskError, match="pyproject.toml is not valid TOML"):
    build_tasks(repo_fixture.write(str(tmp_path / "p"), files), out, CONFIG)
  _assert_nothing_written(tmp_path, out)
  with pytest.raises(TaskError, match="does not exist"):
    build_tasks(str(tmp_path / "nowhere"), out, CONFIG)
  _assert_nothing_written(tmp_path, out)


@pytest.mark.docker
def test_docker_build_error_names_the_problem(tmp_path, monkeypatch):
  from legorl_jax.errors import SandboxError
  from legorl_jax.sandbox import images
  from legorl_jax.sandbox.docker_sandbox import docker_client
  try:
    client = docker_client(timeout=10)
  except SandboxError as e:
    pytest.skip(str(e))
  base = f"{images.IMAGE_REPO}:{images.recipe_hash('bookworm', ('python3', 'git'), 'minbase', None)}"
  if not images.image_exists(client, base):
    pytest.skip("the base image is not built (building it needs the Debian mirror)")
  monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: the missing backend fails at once
  files = dict(repo_fixture.FILES)
  files["pyproject.toml"] = files["pyproject.toml"].replace('requires = ["setuptools>=61"]',
                                                            'requires = ["legorl-no-such-backend==0.0.0"]')
  out = str(tmp_path / "t.jsonl")
  config = BuildConfig(sandbox=SandboxConfig(backend="docker"), image_cache_dir=str(tmp_path / "cache"))
  with pytest.raises(TaskError, match=r"(?s)build error: resolving the dependencies of tallykit.*legorl-no-such-backend"):
    build_tasks(repo_fixture.write(str(tmp_path / "p"), files), out, config)
  _assert_nothing_written(tmp_path, out)
  assert not [n for n in os.listdir(tmp_path / "cache") if n.startswith("wheels-")]
  assert not client.images.list(name="legorl/repo-tallykit-0.3.0")


def test_sources_git_checkout_and_sdist_give_the_same_clean_tree(tmp_path):
  from legorl_jax.taskgen.repo import source
  import zipfile
  repo = repo_fixture.write(str(tmp_path / "git"))
  with open(os.path.join(repo, ".gitignore"), "w") as f:
    f.write("scratch/\n")
  os.makedirs(os.path.join(repo, "scratch"))
  with open(os.path.join(repo, "scratch", "notes.py"), "w") as f:
    f.write("x = 1\n")
  env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
         "GIT_COMMITTER_EMAIL": "a@b"}
  subprocess.run("git init -q && git add pyproject.toml tallykit && git commit -qm init", shell=True,
                 cwd=repo, check=True, env=env)  # README and tests stay untracked (not ignored)
  got = source.load_project(repo, str(tmp_path / "from_git"))
  files = sorted(os.path.relpath(os.path.join(d, f), got.root) for d, _, fs in os.walk(got.root) for f in fs)
  assert files == sorted(list(repo_fixture.FILES) + [".gitignore"])
  assert (got.name, got.version) == ("tallykit", "0.3.0")
  # The same project as a zip sdist (one top directory, PKG-INFO) and as a .tar.gz.
  z = str(tmp_path / "tallykit-0.3.0.zip")
  with zipfile.ZipFile(z, "w") as zf:
    for rel, text in repo_fixture.FILES.items():
      zf.writestr(f"tallykit-0.3.0/{rel}", text)
  from_zip = source.load_project(z, str(tmp_path / "from_zip"))
  from_tgz = source.load_project(repo_fixture.sdist(str(tmp_path / "t.tar.gz"), repo_fixture.FILES),
                                 str(tmp_path / "from_tgz"))
  assert from_zip.content_hash == from_tgz.content_hash
  assert from_zip.content_hash == source.tree_hash(repo_fixture.write(str(tmp_path / "plain")))
  with pytest.raises(TaskError, match="not NAME==VERSION"):
    source.fetch_pypi_sdist("inflection")
