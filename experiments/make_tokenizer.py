r"""Trains the bundled byte-level BPE tokenizer of the tiny / small presets.

The corpus is text this repository produces: the repo's own Python files, the files of
generated bug-fix tasks (`legorl_jax.taskgen.synthetic`, when importable), and, from a seed,
Python modules, tests, diffs, shell sessions (ls, cat -n, git, pytest, tracebacks) and agent
transcripts (tool definitions, <tool_call> JSON calls, tool responses) generated here and
rendered through the package's chat template. The output is a `transformers` fast-tokenizer
directory: 8183 BPE ids, then the added tokens of `legorl_jax.models.chat_template` (ids
8183..8191), 8192 in all; ~20 s on 2 CPU cores.

Regenerate the committed files (from the repository root):

  python experiments/make_tokenizer.py

Training is deterministic for the same inputs. The repo's files are inputs too, so
`corpus_manifest.json` records the sha256 of each; `--check` retrains and compares with the
committed tokenizer.json, naming the inputs that changed since. A new tokenizer means new
token ids: a checkpoint must be used with the tokenizer files it was trained with.
`--quick --out DIR` trains a 1024-id vocabulary on a small generated corpus.
"""

import argparse
import hashlib
import io
import json
import pathlib
import re
import sys
import tarfile
import tempfile

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers.utils.chat_template_utils import render_jinja_template

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(REPO_ROOT))

from experiments.tokenizer_corpus import Gen  # pylint: disable=g-import-not-at-top
from legorl_jax.models import chat_template as ct  # pylint: disable=g-import-not-at-top

DEFAULT_OUT = REPO_ROOT / "legorl_jax" / "models" / "assets" / "tokenizer"
VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 32768
# Pieces: a role header right after a control token ("assistant\n", kept whole so prompt + reply
# tokenizes as prompt tokens + reply tokens); letters with one optional leading non-letter
# (" foo", ".append", "_name"); single digits; punctuation runs with trailing newlines;
# newlines; whitespace runs that leave their last space to the next word.
SPLIT_PATTERN = (r"\A(?:" + "|".join(ct.ROLES) + r")\n"
                 r"|[^\r\n\p{L}\p{N}]?\p{L}+"
                 r"|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+"
                 r"|\s+(?!\S)"
                 r"|\s+")

# ---------------------------------------------------------------------------------------------
# Corpus.


def repo_sources(root=REPO_ROOT):
  """The repo's own Python files, sorted by path: list of (relative path, text)."""
  out = []
  for p in sorted(root.rglob("*.py")):
    rel = p.relative_to(root).as_posix()
    parts = p.relative_to(root).parts
    if any(part.startswith(".") or part in ("build", "dist", "__pycache__") for part in parts):
      continue
    out.append((rel, p.read_text(encoding="utf-8", errors="replace")))
  return out


def synthetic_task_sources(seed, n_tasks=64):
  """Instructions, repo files, hidden tests and gold patches of generated bug-fix tasks.

  Best effort: `legorl_jax.taskgen.synthetic` is optional here; without it (or if it fails) the
  corpus goes without these documents, and the manifest says so.
  """
  try:
    from legorl_jax.taskgen.synthetic import generate_tasks  # pylint: disable=g-import-not-at-top
    tasks = generate_tasks(n_tasks, seed=seed)
  except Exception:  # pylint: disable=broad-except
    return []
  docs = []
  for task in tasks:
    docs += [task.instruction, task.gold_patch, *task.hidden_tests.values()]
    data = getattr(task.repo, "data", None)
    if data:
      with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
          f = tar.extractfile(member) if member.isfile() else None
          if f is not None:
            docs.append(f.read().decode("utf-8", errors="replace"))
  return docs


def render_conversation(messages, tools):
  """Text of a conversation rendered with the package's chat template."""
  rendered, _ = render_jinja_template([messages], tools=tools, chat_template=ct.CHAT_TEMPLATE)
  return rendered[0]


def generated_documents(seed, n_units):
  """`n_units` groups of documents; each unit is a module, tests, a diff, shell and chats."""
  g = Gen(seed)
  for _ in range(n_units):
    path = g.path()
    yield f"# {path}\n{g.module()}"
    yield g.test_module(path)
    yield g.diff()
    for _ in range(3):
      cmd, out = g.shell()
      yield f"$ {cmd}\n{out}"
    yield render_conversation(*g.conversation())
    if g.r.random() < 0.3:
      yield render_conversation(*g.qa())


def build_corpus(seed=0, n_units=1500, repo_text=True, root=REPO_ROOT):
  """(documents, manifest): the training text, in a fixed order, and what went into it.

  `repo_text` adds the repo's Python files and the synthetic tasks' files; without it the
  corpus depends only on (seed, n_units).
  """
  docs, manifest = [], {"seed": seed, "n_units": n_units, "repo_files": {}}
  if repo_text:
    for rel, text in repo_sources(root):
      docs.append(text)
      manifest["repo_files"][rel] = hashlib.sha256(text.encode()).hexdigest()
    tasks = synthetic_task_sources(seed)
    manifest["synthetic_task_docs"] = len(tasks)
    manifest["synthetic_task_sha256"] = hashlib.sha256("\0".join(tasks).encode()).hexdigest()
    docs += tasks
  docs += list(generated_documents(seed, n_units))
  manifest["documents"] = len(docs)
  manifest["characters"] = sum(len(d) for d in docs)
  return docs, manifest


_ADDED_RE = re.compile("|".join(re.escape(t) for t in ct.ADDED_TOKENS))


def training_pieces(docs):
  """Splits documents at added-token strings, as encoding does, so BPE never learns them."""
  for d in docs:
    for piece in _ADDED_RE.split(d):
      if piece:
        yield piece


# ---------------------------------------------------------------------------------------------
# Training and output.


def train(docs, vocab_size=VOCAB_SIZE):
  """A byte-level BPE `tokenizers.Tokenizer` with exactly `vocab_size` ids (added tokens last)."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  n_bpe = vocab_size - len(ct.ADDED_TOKENS)
  trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=2, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(training_pieces(docs), trainer)
  if tok.get_vocab_size() != n_bpe:
    raise RuntimeError(f"BPE training reached {tok.get_vocab_size()} ids, not {n_bpe}: the "
                       "corpus is too small; raise --units.")
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ct.CONTROL_TOKENS])
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ct.MARKUP_TOKENS])
  assert tok.get_vocab_size() == vocab_size
  return tok


def tokenizer_files(tok):
  """{file name: text} of a `transformers` tokenizer directory."""
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",  # Loads tokenizer.json as is (v4 and v5).
      "bos_token": None,
      "eos_token": ct.EOS_TOKEN,
      "pad_token": ct.PAD_TOKEN,
      "unk_token": None,
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "split_special_tokens": False,
      "model_max_length": MODEL_MAX_LENGTH,
      "chat_template": ct.CHAT_TEMPLATE,
  }
  special = {"eos_token": ct.EOS_TOKEN, "pad_token": ct.PAD_TOKEN}
  return {
      "tokenizer.json": tok.to_str(pretty=False) + "\n",
      "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
      "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
  }


def write(tok, out_dir, manifest):
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  files = tokenizer_files(tok)
  files["corpus_manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
  for name, text in files.items():
    (out_dir / name).write_text(text, encoding="utf-8")
  return out_dir


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=str(DEFAULT_OUT), help="output directory")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--units", type=int, default=1500, help="generated document groups")
  ap.add_argument("--quick", action="store_true", help="small corpus and 1024-id vocabulary")
  ap.add_argument("--check", action="store_true", help="retrain and compare with --out")
  args = ap.parse_args(argv)
  if args.quick and pathlib.Path(args.out) == DEFAULT_OUT:
    ap.error("--quick would overwrite the bundled tokenizer; pass --out DIR")
  units, vocab = (60, 1024) if args.quick else (args.units, VOCAB_SIZE)
  docs, manifest = build_corpus(args.seed, units, repo_text=not args.quick)
  tok = train(docs, vocab)
  if args.check:
    with tempfile.TemporaryDirectory() as tmp:
      write(tok, tmp, manifest)
      fresh = (pathlib.Path(tmp) / "tokenizer.json").read_text()
    committed = (pathlib.Path(args.out) / "tokenizer.json").read_text()
    if fresh != committed:
      old = json.loads((pathlib.Path(args.out) / "corpus_manifest.json").read_text())
      changed = set(old["repo_files"].items()) ^ set(manifest["repo_files"].items())
      tasks = old.get("synthetic_task_sha256") != manifest.get("synthetic_task_sha256")
      print("MISMATCH: retrained tokenizer.json differs; changed repo files: "
            f"{sorted({k for k, _ in changed})}; synthetic tasks changed: {tasks}")
      return 1
    print("OK: retrained tokenizer.json is identical")
    return 0
  out = write(tok, args.out, manifest)
  print(json.dumps({"out": str(out), "vocab_size": tok.get_vocab_size(),
                    "documents": manifest["documents"], "characters": manifest["characters"]}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
