"""Build tasks from a real repository: baseline -> mutations -> tasks -> validation -> JSONL.

1. The project's environment (``env_spec``) and, on the Docker backend, its image.
2. Baseline: the suite runs twice in one sandbox; the tests that pass both times are the
   candidates for FAIL_TO_PASS and PASS_TO_PASS (a test failing before any mutation is an
   error unless ``allow_failing_tests``, then it is left out).
3. Mutations, one at a time in the same sandbox: a mutation is kept when the suite still
   runs to the end, at least one baseline-passing test fails and at least one still passes.
   Functions are visited in a seeded order, round robin, at most ``max_per_function`` kept
   each, until ``max_mutations`` were tried, ``max_tasks`` kept or ``time_budget_s`` spent.
4. Each kept mutation becomes a task: the repository with the mutated file and without the
   test files holding FAIL_TO_PASS tests (they are the hidden tests), the inverse diff as the
   gold patch, and an issue-style instruction (``instruction``).
5. Validation with the real verifier, each in a fresh sandbox: the task as shipped fails,
   the task with the gold patch is solved. The verifier's seconds are recorded per task.
6. The JSONL (and the TFDS dataset) is written under a temporary name and moved into place
   only when everything succeeded: on any error nothing is left at the output paths. Each
   task has a split (``metadata.split``): a function belongs to exactly one of train and
   validation (``synthetic.split_of``), so the TFDS dataset's splits share no buggy function.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time

from legorl_jax.errors import LegorlError, TaskError
from legorl_jax.rewards import results, status as st, verifier
from legorl_jax.sandbox import SandboxConfig, create_sandbox
from legorl_jax.sandbox.diff import compute_diff
from legorl_jax.tasks import jsonl, repo as repo_lib
from legorl_jax.taskgen.repo import env_spec as env_lib, instruction as instr_lib, mutate, source, suite
from legorl_jax.tasks.schema import Limits, RepoSource, Task, TaskMetadata, VerifierSpec
from legorl_jax.taskgen.synthetic.generator import split_of

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BuildConfig:
  """Knobs of one build. ``sandbox``: a SandboxConfig (its ``backend`` picks local or
  docker). ``run_timeout_s``: per suite run; None = 3x the baseline run + 30 s.
  ``unique_edits``: keep only tasks whose fix is a set of exact-string edits of whole lines
  that each match once (what exact-replace edit tools, and the scripted demonstrations, need).
  """
  sandbox: SandboxConfig = SandboxConfig(backend="docker")
  max_mutations: int = 150
  max_tasks: int = 40
  max_per_function: int = 2
  seed: int = 0
  run_timeout_s: float | None = None
  time_budget_s: float = 1200.0
  build_timeout_s: float = 900.0
  allow_failing_tests: bool = False
  validate: bool = True
  extras: tuple[str, ...] | None = None
  requirements: tuple[str, ...] = ()
  pytest_args: tuple[str, ...] = ()
  image_cache_dir: str | None = None
  unique_edits: bool = True
  limits: Limits = Limits(timeout_s=1800.0, memory_mb=2048, pids=256, cpus=1.0)


@dataclasses.dataclass
class Candidate:
  site: mutate.FunctionSite
  mutation: object
  original: str
  mutated: str
  fail_to_pass: list[str]
  pass_to_pass: list[str]
  messages: dict[str, str]


@dataclasses.dataclass
class BuildReport:
  """What the build did; ``to_dict()`` is the summary make_tasks prints."""
  project: str = ""
  version: str = ""
  origin: str = ""
  content_hash: str = ""
  env: dict = dataclasses.field(default_factory=dict)
  image: str | None = None
  image_s: float = 0.0
  baseline_tests: int = 0
  baseline_passing: int = 0
  baseline_s: float = 0.0
  functions: int = 0
  mutations_tried: int = 0
  kept: int = 0
  rejected: dict[str, int] = dataclasses.field(default_factory=dict)
  kept_by_family: dict[str, int] = dataclasses.field(default_factory=dict)
  tasks: int = 0
  validation_failed: list[str] = dataclasses.field(default_factory=list)
  verifier_s: list[float] = dataclasses.field(default_factory=list)
  mutation_phase_s: float = 0.0
  validation_s: float = 0.0
  wall_s: float = 0.0
  out: str = ""
  tfds_dir: str | None = None

  def reject(self, reason: str) -> None:
    self.rejected[reason] = self.rejected.get(reason, 0) + 1

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    v = sorted(self.verifier_s)
    d["verifier_s"] = ({"n": len(v), "mean": round(sum(v) / len(v), 3), "median": round(v[len(v) // 2], 3),
                        "max": round(v[-1], 3)} if v else {})
    return d


def build_tasks(path: str, out_path: str, config: BuildConfig = BuildConfig(), *,
                origin: str | None = None, tfds_dir: str | None = None) -> BuildReport:
  """Builds tasks from the project at ``path`` and writes them to ``out_path`` (JSONL).

  Raises TaskError (bad input, build error) or SandboxError (no engine) with nothing
  written; returns the BuildReport on success.
  """
  t_start = time.perf_counter()
  rep = BuildReport(origin=origin or path, out=out_path)
  for p in (out_path, tfds_dir):
    if p and os.path.exists(p):
      raise TaskError(f"output {p!r} already exists; remove it or choose another path")
  tmp = tempfile.mkdtemp(prefix="legorl-repotasks-")
  try:
    project = source.load_project(path, os.path.join(tmp, "project"), origin=origin)
    rep.project, rep.version, rep.content_hash = project.name, project.version, project.content_hash
    spec = env_lib.discover(project.root, extras=config.extras, requirements=config.requirements,
                            pytest_args=config.pytest_args)
    rep.env = spec.to_dict()
    image = None
    if config.sandbox.backend == "docker":
      from legorl_jax.sandbox.docker_sandbox import docker_client
      from legorl_jax.taskgen.repo import repo_image
      t0 = time.perf_counter()
      image = repo_image.ensure_repo_image(docker_client(), project, spec, cache_dir=config.image_cache_dir,
                                           timeout_s=config.build_timeout_s)
      rep.image, rep.image_s = image, round(time.perf_counter() - t0, 2)
    probe = Task(id=f"repo-build/{project.slug}", repo=RepoSource(kind="dir", path=project.root),
                 instruction="(task builder: baseline and mutation runs)",
                 verifier=VerifierSpec(kind="pytest", test_files=spec.test_paths), image=image,
                 limits=config.limits)
    with create_sandbox(probe, config.sandbox) as sb:
      passing, baseline_s = _baseline(sb, spec, project, config, rep)
      timeout = config.run_timeout_s or 3 * baseline_s + 30.0
      t0 = time.perf_counter()
      cands = _mutations(sb, spec, project, passing, timeout, config, rep)
      rep.mutation_phase_s = round(time.perf_counter() - t0, 2)
    tasks = _tasks(cands, project, spec, image, baseline_s, config, rep)
    if config.validate:
      t0 = time.perf_counter()
      tasks = _validate(tasks, config, rep)
      rep.validation_s = round(time.perf_counter() - t0, 2)
    if not tasks:
      raise TaskError(f"no valid task from {rep.origin}: {rep.mutations_tried} mutations tried, "
                      f"rejected {rep.rejected}; raise --max_mutations or check the suite covers "
                      "the project's code")
    rep.tasks = len(tasks)
    rep.tfds_dir = _write_outputs(tasks, out_path, tfds_dir, tmp)
    return rep
  finally:
    rep.wall_s = round(time.perf_counter() - t_start, 2)
    shutil.rmtree(tmp, ignore_errors=True)


# --- baseline ---------------------------------------------------------------------------------

def _baseline(sb, spec, project, config, rep) -> tuple[list[str], float]:
  timeout = config.run_timeout_s or max(600.0, config.time_budget_s / 2)
  runs = [suite.run_suite(sb, spec, timeout_s=timeout) for _ in range(2)]
  first = runs[0]
  if first.timed_out:
    raise TaskError(f"the test suite of {project.name} did not finish in {timeout:.0f}s before any "
                    "mutation; give a longer --run_timeout_s or narrower --pytest_args")
  if not first.junit_found:
    raise TaskError(f"the test suite of {project.name} could not run before any mutation (exit "
                    f"{first.exit_code}; is pytest installed where the sandbox runs it: in the image, "
                    f"or for --sandbox=local in the host's python3?): {first.output_tail[-800:]}")
  if first.exit_code == 5 or (first.exit_code in (0, 1) and not first.outcomes):
    raise TaskError(f"no tests found: pytest collected no tests from {list(spec.test_paths)} in "
                    f"{project.name}: {first.output_tail[-800:]}")
  if first.exit_code not in suite.PYTEST_OK_CODES:
    raise TaskError(f"the test suite of {project.name} fails before any mutation (pytest exit "
                    f"{first.exit_code}: collection or usage error): {first.output_tail[-1500:]}")
  bad = sorted(t for r in runs for t, o in r.outcomes.items() if o in (results.FAILED, results.ERROR))
  rep.baseline_tests = len(first.outcomes)
  if bad and not config.allow_failing_tests:
    shown = "; ".join(f"{t}: {first.messages.get(t, '')[:160]!r}" for t in sorted(set(bad))[:5])
    raise TaskError(f"the test suite of {project.name} fails before any mutation: {len(set(bad))} of "
                    f"{len(first.outcomes)} tests fail ({shown}); fix the environment (--requirements, "
                    "--extras) or pass --allow_failing_tests to leave those tests out")
  passing = sorted(set.intersection(*(r.passed() for r in runs)))
  if not passing:
    raise TaskError(f"no test of {project.name} passes before any mutation; nothing to build on")
  rep.baseline_passing = len(passing)
  rep.baseline_s = round(max(r.duration_s for r in runs), 3)
  log.info("baseline of %s: %d tests, %d passing, %.2fs", project.name, len(first.outcomes),
           len(passing), rep.baseline_s)
  return passing, rep.baseline_s


# --- mutations --------------------------------------------------------------------------------

def _mutations(sb, spec, project, passing, timeout, config, rep) -> list[Candidate]:
  rng = random.Random(f"{config.seed}:{project.content_hash}")
  sources = {}
  sites = []
  for rel in mutate.source_files(project.root):
    with open(os.path.join(project.root, rel), encoding="utf-8", errors="surrogateescape") as f:
      sources[rel] = f.read()
    sites += mutate.functions_of(sources[rel], rel)
  rep.functions = len(sites)
  rng.shuffle(sites)
  pending: dict[int, list] = {}
  kept_per: dict[int, int] = {}
  active = list(range(len(sites)))
  passing_set = set(passing)
  out: list[Candidate] = []
  deadline = time.monotonic() + config.time_budget_s
  while active and rep.mutations_tried < config.max_mutations and len(out) < config.max_tasks:
    if time.monotonic() > deadline:
      rep.reject("time_budget_left_untried")
      break
    for i in list(active):
      if rep.mutations_tried >= config.max_mutations or len(out) >= config.max_tasks or time.monotonic() > deadline:
        break
      site = sites[i]
      if i not in pending:
        try:
          ms = mutate.mutations_of(sources[site.path], site)
        except (SyntaxError, KeyError, ValueError):
          ms = []
        rng.shuffle(ms)
        pending[i] = ms
      if not pending[i] or kept_per.get(i, 0) >= config.max_per_function:
        active.remove(i)
        continue
      m = pending[i].pop()
      if config.unique_edits and not _unique_edits(site.path, m.apply(sources[site.path]), sources[site.path]):
        rep.reject("fix_not_a_unique_edit")  # decided without running the suite
        continue
      cand = _try(sb, spec, site, m, sources[site.path], passing_set, timeout, rep)
      if cand is not None:
        out.append(cand)
        kept_per[i] = kept_per.get(i, 0) + 1
        rep.kept += 1
        rep.kept_by_family[m.family] = rep.kept_by_family.get(m.family, 0) + 1
  return out


def _try(sb, spec, site, m, original, passing, timeout, rep) -> Candidate | None:
  rep.mutations_tried += 1
  mutated = m.apply(original)
  sb.write_file(site.path, mutated)
  try:
    run = suite.run_suite(sb, spec, timeout_s=timeout)
  finally:
    sb.write_file(site.path, original)
  if run.timed_out:
    rep.reject("timeout")
    return None
  if not run.completed:
    rep.reject("suite_broken")
    return None
  if passing - set(run.outcomes):
    rep.reject("tests_missing")
    return None
  still = passing & run.passed()
  f2p, p2p = sorted(passing - still), sorted(still)
  if not f2p:
    rep.reject("no_test_fails")
    return None
  if not p2p:
    rep.reject("every_test_fails")
    return None
  return Candidate(site, m, original, mutated, f2p, p2p, {t: run.messages.get(t, "") for t in f2p})


# --- tasks ------------------------------------------------------------------------------------

def _tree_files(root: str) -> dict[str, bytes]:
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for f in sorted(filenames):
      full = os.path.join(dirpath, f)
      with open(full, "rb") as fh:
        out[os.path.relpath(full, root)] = fh.read()
  return out


def _tasks(cands, project, spec, image, baseline_s, config, rep) -> list[Task]:
  files = _tree_files(project.root)
  test_sources = {p: b.decode("utf-8", "replace") for p, b in files.items() if env_lib.is_test_file(p)
                  and p.endswith(".py")}
  tasks, seen = [], set()
  for c in cands:
    hidden_paths = sorted({t.split("::")[0] for t in c.fail_to_pass})
    if not all(p in files for p in hidden_paths):
      rep.reject("test_file_unknown")
      continue
    text = instr_lib.make_instruction(project.name, [(t, c.messages.get(t, "")) for t in c.fail_to_pass],
                                      path=c.site.path, qualname=c.site.qualname, test_sources=test_sources)
    if text is None:
      rep.reject("instruction_would_leak")
      continue
    if text in seen:
      rep.reject("duplicate_instruction")
      continue
    seen.add(text)
    shipped = {p: b for p, b in files.items() if p not in hidden_paths}
    shipped[c.site.path] = c.mutated.encode("utf-8", "surrogateescape")
    gold = compute_diff({c.site.path: shipped[c.site.path]},
                        {c.site.path: c.original.encode("utf-8", "surrogateescape")}).patch
    m = c.mutation
    key = hashlib.sha256(f"{project.content_hash}|{c.site.path}|{m.lineno}|{m.old}|{m.new}".encode()).hexdigest()[:12]
    test_files = tuple(sorted({t.split("::")[0] for t in c.fail_to_pass + c.pass_to_pass}))
    task = Task(
        id=f"repo/{project.slug}/{key}",
        repo=RepoSource(kind="archive", data=repo_lib.files_to_archive(shipped)),
        instruction=text,
        verifier=VerifierSpec(kind="pytest", test_files=test_files, command=" ".join(spec.pytest_args),
                              timeout_s=round(max(60.0, 5 * baseline_s + 30.0), 1)),
        hidden_tests={p: files[p].decode("utf-8", "surrogateescape") for p in hidden_paths},
        gold_patch=gold, fail_to_pass=tuple(c.fail_to_pass), pass_to_pass=tuple(c.pass_to_pass),
        image=image, limits=config.limits,
        metadata=TaskMetadata(language="python", source="repo", extra={
            "project": project.name, "version": project.version, "origin": rep.origin,
            "content_hash": project.content_hash, "file": c.site.path, "function": c.site.qualname,
            "split": split_of(f"{project.name}/{c.site.path}", c.site.qualname),
            "family": m.family, "bug_line": m.lineno, "bug_old": m.old, "bug_new": m.new,
            "install_command": spec.install_command, "test_command": spec.test_command}))
    tasks.append(Task.from_dict(json.loads(json.dumps(task.to_dict()))))  # the schema's own check
  return tasks


def _unique_edits(path: str, mutated: str, original: str) -> bool:
  """True when the fix (the inverse diff), as the exact-string edits an edit tool takes
  (whole changed lines; a pure insertion anchored on the line above), has each edit's old
  text exactly once in the file at its turn, and the edits give back the original."""
  from legorl_jax.harnesses.scripted import edits_from_patch
  gold = compute_diff({path: mutated.encode("utf-8", "surrogateescape")},
                      {path: original.encode("utf-8", "surrogateescape")}).patch
  text = mutated
  for e in edits_from_patch(gold):
    if not e.old or text.count(e.old) != 1:
      return False
    text = text.replace(e.old, e.new, 1)
  return text == original


# --- validation -------------------------------------------------------------------------------

def validate_task(task: Task, sandbox_config: SandboxConfig) -> tuple[bool, str, float]:
  """(valid, why not, verifier seconds of the gold run): the task as shipped fails with every
  FAIL_TO_PASS test failing and every PASS_TO_PASS test passing; with the gold patch it is
  solved. Each check runs the real verifier in a fresh sandbox."""
  with create_sandbox(task, sandbox_config) as sb:
    before = verifier.verify(sb, task)
  if before.status != st.FAILED:
    return False, f"unmodified repository: status {before.status} ({before.error or before.output_tail[-300:]})", 0.0
  not_failing = [t for t, o in before.fail_to_pass.items() if o == results.PASSED]
  broken = [t for t, o in before.pass_to_pass.items() if o != results.PASSED]
  if not_failing or broken:
    return False, f"unmodified repository: FAIL_TO_PASS passing {not_failing[:3]}, PASS_TO_PASS not passing {broken[:3]}", 0.0
  with create_sandbox(task, sandbox_config) as sb:
    r = sb.apply_patch(task.gold_patch)
    if not r.ok:
      return False, f"gold patch does not apply: {r.stderr[-300:]!r}", 0.0
    after = verifier.verify(sb, task)
  if after.status != st.SOLVED:
    bad = {t: o for t, o in {**after.fail_to_pass, **after.pass_to_pass}.items() if o != results.PASSED}
    return False, f"gold patch: status {after.status}, not passing {dict(list(bad.items())[:3])} {after.error}", 0.0
  return True, "", after.duration_s


def _validate(tasks, config, rep) -> list[Task]:
  out = []
  for t in tasks:
    try:
      ok, why, secs = validate_task(t, config.sandbox)
    except LegorlError as e:
      ok, why, secs = False, f"{type(e).__name__}: {e}", 0.0
    if ok:
      out.append(_with_verifier_s(t, secs))
      rep.verifier_s.append(round(secs, 3))
    else:
      log.warning("task %s failed validation: %s", t.id, why)
      rep.validation_failed.append(f"{t.id}: {why[:300]}")
  return out


def _with_verifier_s(task: Task, secs: float) -> Task:
  extra = {**task.metadata.extra, "verifier_s": round(secs, 3)}
  return dataclasses.replace(task, metadata=dataclasses.replace(task.metadata, extra=extra))


# --- output -----------------------------------------------------------------------------------

def _write_outputs(tasks, out_path, tfds_dir, tmp) -> str | None:
  """Writes under temporary names next to the targets, then moves them into place; returns
  the directory to read the TFDS dataset from (``tasks.source`` / ``tasks=``), if built."""
  out_dir = os.path.dirname(os.path.abspath(out_path))
  os.makedirs(out_dir, exist_ok=True)
  part = os.path.join(out_dir, f".{os.path.basename(out_path)}.{os.getpid()}.part")
  tfds_part = readable = None
  try:
    jsonl.write_tasks_jsonl(part, tasks)
    loaded, errors = jsonl.load_tasks_jsonl(part)
    if errors or len(loaded) != len(tasks):
      raise TaskError(f"the written task file does not load back: {errors[:1]}")
    if tfds_dir:
      from legorl_jax.tasks.tfds_builder import build_task_dataset
      tfds_part = tfds_dir.rstrip("/") + f".{os.getpid()}.part"
      splits = {}
      for t in tasks:
        splits.setdefault(t.metadata.extra["split"], []).append(t)
      if len(splits) < 2:
        log.warning("all %d tasks fall in split %s; the dataset has no other split", len(tasks), list(splits))
      files = {}
      for name, ts in splits.items():
        files[name] = os.path.join(tmp, f"{name}.jsonl")
        jsonl.write_tasks_jsonl(files[name], ts)
      inner = os.path.relpath(build_task_dataset(files, tfds_part), tfds_part)
      os.replace(tfds_part, tfds_dir)
      readable = os.path.normpath(os.path.join(tfds_dir, inner))
      tfds_part = None
    os.replace(part, out_path)
    return readable
  except BaseException:
    if tfds_part:
      shutil.rmtree(tfds_part, ignore_errors=True)
    if tfds_dir and os.path.exists(tfds_dir) and not os.path.exists(out_path):
      shutil.rmtree(tfds_dir, ignore_errors=True)
    raise
  finally:
    if os.path.exists(part):
      os.unlink(part)
