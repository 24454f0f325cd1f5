#!/usr/bin/env python3
"""Runs the OpenHands SDK's default agent on one task (executed by the SDK's own Python >= 3.12
virtualenv inside the sandbox, never imported by legorl_jax).

  python openhands_runner.py --base-url URL --model openai/NAME --task-file TASK.md \
      [--max-iterations N] [--temperature T]

The API key comes from ``LLM_API_KEY``. The agent (terminal, file editor, task tracker and
the built-in finish tool; no browser) works in the current directory and stops on ``finish``.
Exit codes: 0 finished, 3 iteration budget used up or stuck, 4 the context overflowed,
2 the endpoint or the SDK failed, 1 bad usage. The last stdout line is a JSON summary.
"""

import argparse
import json
import os
import sys

EXIT_FINISHED, EXIT_USAGE, EXIT_ERROR, EXIT_BUDGET, EXIT_CONTEXT = 0, 1, 2, 3, 4


def _is_context_error(exc: BaseException) -> bool:
  text = f"{type(exc).__name__} {exc}"
  return "ContextWindow" in text or "context_length_exceeded" in text


def _stopped_on_context(events) -> bool:
  """The SDK answers a context overflow with a condensation request instead of raising; the
  run ended on the context when no agent action followed the last such request."""
  last_request = last_action = -1
  for i, e in enumerate(events):
    kind = type(e).__name__
    if kind == "CondensationRequest":
      last_request = i
    elif kind == "ActionEvent":
      last_action = i
  return last_request > last_action


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--base-url", required=True)
  ap.add_argument("--model", required=True)
  ap.add_argument("--task-file", required=True)
  ap.add_argument("--max-iterations", type=int, default=30)
  ap.add_argument("--temperature", type=float, default=None)
  ap.add_argument("--max-output-tokens", type=int, default=None)
  ap.add_argument("--retries", type=int, default=1)
  a = ap.parse_args(argv)
  with open(a.task_file) as f:
    task = f.read()
  if not task.strip():
    print("error: empty task", file=sys.stderr)
    return EXIT_USAGE

  from openhands.sdk import LLM, Conversation
  from openhands.sdk.conversation.state import ConversationExecutionStatus
  from openhands.tools.preset.default import get_default_agent

  llm = LLM(model=a.model, base_url=a.base_url, api_key=os.environ.get("LLM_API_KEY", "none"),
            usage_id="agent", temperature=a.temperature, max_output_tokens=a.max_output_tokens,
            num_retries=a.retries, retry_min_wait=1, retry_max_wait=2, timeout=600)
  agent = get_default_agent(llm=llm, cli_mode=True)
  conversation = Conversation(agent=agent, workspace=os.getcwd(),
                              max_iteration_per_run=a.max_iterations)
  code, status = EXIT_ERROR, "error"
  try:
    conversation.send_message(task)
    conversation.run()
    status = str(getattr(conversation.state.execution_status, "value",
                         conversation.state.execution_status))
    if status == ConversationExecutionStatus.FINISHED.value:
      code = EXIT_FINISHED
    elif _stopped_on_context(conversation.state.events):
      code = EXIT_CONTEXT
    elif status == ConversationExecutionStatus.ERROR.value:
      # The SDK records failures as events instead of raising: look at the last one.
      errors_ = [e for e in conversation.state.events if "Error" in type(e).__name__]
      texts = [f"{type(e).__name__}: {getattr(e, 'code', '')}: {getattr(e, 'detail', '') or e}"
               for e in errors_]
      for t in texts:
        print(t[:1000], file=sys.stderr)
      if texts:
        status = texts[-1][:500]
      if any(_is_context_error(RuntimeError(t)) for t in texts):
        code = EXIT_CONTEXT
      elif texts and "MaxIterationsReached" in texts[-1]:
        code = EXIT_BUDGET
    elif status in (ConversationExecutionStatus.STUCK.value, ConversationExecutionStatus.RUNNING.value,
                    ConversationExecutionStatus.IDLE.value):
      code = EXIT_BUDGET
  except Exception as e:  # noqa: BLE001 -- reported through the exit code
    code = EXIT_CONTEXT if _is_context_error(e) else EXIT_ERROR
    status = f"{type(e).__name__}: {str(e)[:500]}"
    print(f"error: {status}", file=sys.stderr)
  finally:
    try:
      conversation.close()
    except Exception:  # noqa: BLE001
      pass
  print(json.dumps({"exit_code": code, "status": status}))
  return code


if __name__ == "__main__":
  sys.exit(main())
