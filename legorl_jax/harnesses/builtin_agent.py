#!/usr/bin/env python3
"""legorl's built-in coding agent: a compact OpenAI-chat tool loop.

A real harness like the others: a separate process that speaks HTTP to an OpenAI-compatible
endpoint, runs tools in its working directory and stops on ``submit``. It uses only the
standard library so it runs with whatever ``python3`` a sandbox has.

  python3 builtin_agent.py --base-url URL --model NAME --task-file TASK.md [--max-turns N]

The API key comes from ``OPENAI_API_KEY``. Exit codes: 0 submitted, 3 turn budget used up,
4 context budget used up (the endpoint answered 400 context_length_exceeded), 2 the endpoint
failed (harness/infrastructure side), 1 bad usage.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

SYSTEM_PROMPT = (
    "You fix bugs in the repository in the current directory. Use the tools: "
    "bash runs a shell command, edit replaces an exact string in a file, submit ends the task.")

TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "edit", "description": "Replace the exact string old with new in a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Finish the task.",
        "parameters": {"type": "object", "properties": {}}}},
]

EXIT_SUBMITTED, EXIT_USAGE, EXIT_API, EXIT_TURNS, EXIT_CONTEXT = 0, 1, 2, 3, 4
MAX_OUTPUT_CHARS = 2000


class ContextExceeded(Exception):
  pass


class ApiError(Exception):
  pass


def chat(base_url, api_key, payload, timeout, retries=2):
  """POST /chat/completions; retries transient failures, never a 4xx."""
  body = json.dumps(payload).encode()
  req = urllib.request.Request(
      base_url.rstrip("/") + "/chat/completions", data=body, method="POST",
      headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
  for attempt in range(retries + 1):
    try:
      with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())
    except urllib.error.HTTPError as e:
      detail = e.read().decode(errors="replace")[:500]
      if e.code == 400 and "context_length_exceeded" in detail:
        raise ContextExceeded(detail) from e
      if e.code < 500 or attempt == retries:
        raise ApiError(f"HTTP {e.code}: {detail}") from e
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
      if attempt == retries:
        raise ApiError(f"endpoint unreachable: {e}") from e
    time.sleep(0.5 * (attempt + 1))
  raise ApiError("unreachable")


def _clip(text):
  if len(text) <= MAX_OUTPUT_CHARS:
    return text
  half = MAX_OUTPUT_CHARS // 2
  return text[:half] + f"\n[... {len(text) - MAX_OUTPUT_CHARS} characters cut ...]\n" + text[-half:]


def run_bash(command, timeout):
  try:
    p = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout,
                       errors="replace")
    out = (p.stdout + p.stderr).strip()
    return _clip(out if out else f"(exit code {p.returncode}, no output)")
  except subprocess.TimeoutExpired:
    return f"command timed out after {timeout} s"


def run_edit(path, old, new):
  if not isinstance(path, str) or not isinstance(old, str) or not isinstance(new, str):
    return "error: edit needs string arguments path, old, new"
  real = os.path.realpath(path)
  if not real.startswith(os.path.realpath(os.getcwd()) + os.sep):
    return f"error: {path} is outside the repository"
  try:
    with open(real) as f:
      text = f.read()
  except OSError as e:
    return f"error: cannot read {path}: {e.strerror}"
  count = text.count(old) if old else 0
  if count != 1:
    return f"error: old string found {count} times in {path}; it must occur exactly once"
  with open(real, "w") as f:
    f.write(text.replace(old, new, 1))
  return f"edited {path}"


def run_tool(name, arguments, bash_timeout):
  try:
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
  except (ValueError, TypeError, RecursionError):  # stdlib only here (runs in the sandbox)
    return f"error: arguments of {name} are not valid JSON"
  if not isinstance(args, dict):
    return f"error: arguments of {name} must be a JSON object"
  if name == "bash":
    return run_bash(str(args.get("command", "")), bash_timeout)
  if name == "edit":
    return run_edit(args.get("path"), args.get("old"), args.get("new"))
  return f"error: unknown tool {name!r}; use bash, edit or submit"


def log_event(log_path, event):
  if log_path:
    with open(log_path, "a") as f:
      f.write(json.dumps(event) + "\n")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--base-url", required=True)
  ap.add_argument("--model", default="policy")
  ap.add_argument("--task", default=None)
  ap.add_argument("--task-file", default=None)
  ap.add_argument("--max-turns", type=int, default=8)
  ap.add_argument("--max-tokens", type=int, default=256)
  ap.add_argument("--temperature", type=float, default=1.0)
  ap.add_argument("--bash-timeout", type=float, default=20.0)
  ap.add_argument("--request-timeout", type=float, default=600.0)
  ap.add_argument("--log", default=None, help="JSONL log of turns")
  a = ap.parse_args(argv)
  task = a.task
  if a.task_file:
    with open(a.task_file) as f:
      task = f.read()
  if not task:
    print("error: give --task or --task-file", file=sys.stderr)
    return EXIT_USAGE
  api_key = os.environ.get("OPENAI_API_KEY", "none")
  messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
  for turn in range(a.max_turns):
    payload = {"model": a.model, "messages": messages, "tools": TOOLS,
               "max_tokens": a.max_tokens, "temperature": a.temperature}
    try:
      resp = chat(a.base_url, api_key, payload, a.request_timeout)
    except ContextExceeded as e:
      log_event(a.log, {"turn": turn, "event": "context_exceeded", "detail": str(e)[:200]})
      return EXIT_CONTEXT
    except ApiError as e:
      print(f"error: {e}", file=sys.stderr)
      log_event(a.log, {"turn": turn, "event": "api_error", "detail": str(e)[:500]})
      return EXIT_API
    msg = resp["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    assistant = {"role": "assistant", "content": msg.get("content")}
    if calls:
      assistant["tool_calls"] = calls
    messages.append(assistant)
    log_event(a.log, {"turn": turn, "event": "assistant", "message": assistant})
    if not calls:
      messages.append({"role": "user", "content": "Use a tool call: bash, edit or submit."})
      continue
    for call in calls:
      fn = call.get("function", {})
      if fn.get("name") == "submit":
        log_event(a.log, {"turn": turn, "event": "submit"})
        return EXIT_SUBMITTED
      result = run_tool(fn.get("name"), fn.get("arguments"), a.bash_timeout)
      messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
      log_event(a.log, {"turn": turn, "event": "tool", "name": fn.get("name"), "result": result})
  return EXIT_TURNS


if __name__ == "__main__":
  sys.exit(main())
