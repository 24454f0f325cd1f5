"""Special tokens and the ChatML chat template of the bundled tokenizer.

Kept free of `transformers` imports so the tokenizer training script can use the same token
strings and template text the runtime uses.

The template (Jinja, rendered by `transformers.apply_chat_template`) writes every turn as
``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``. Tool definitions go into the system turn as a
``<tools>`` block of JSON signatures; an assistant's tool calls follow its content as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks; tool results are
grouped, consecutive ones together, into one user turn of ``<tool_response>`` blocks.

Each turn renders the same whatever follows it, and the generation prompt is exactly the
header an assistant turn starts with, so the ids of a conversation prefix (with the
generation prompt) are a prefix of the ids of the longer conversation. The proxy relies on
this: sampled ids plus the template's ``\\n`` after ``<|im_end|>`` equal a one-shot render.
"""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Control tokens: removed by `decode(..., skip_special_tokens=True)`.
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Markup tokens: single ids, but kept when decoding so tool calls can be parsed from text.
MARKUP_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE,
                 THINK_OPEN, THINK_CLOSE)
# In id order: the bundled tokenizer appends these after its BPE vocabulary.
ADDED_TOKENS = CONTROL_TOKENS + MARKUP_TOKENS

EOS_TOKEN = IM_END
PAD_TOKEN = ENDOFTEXT

# Turn headers. The bundled pre-tokenizer keeps "ROLE\n" as one piece when it directly follows
# an added token, so content that starts with whitespace cannot merge with the header's "\n".
ROLES = ("system", "user", "assistant", "tool")

CHAT_TEMPLATE = r"""{%- macro text(content) -%}
{%- if content is string -%}
{{- content -}}
{%- elif content is mapping -%}
{{- raise_exception('Message content must be a string or a list of text parts, got a mapping.') -}}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part is string -%}
{{- part -}}
{%- elif part.type == 'text' -%}
{{- part.text -}}
{%- else -%}
{{- raise_exception('Only text content parts can be rendered, got type ' ~ part.type ~ '.') -}}
{%- endif -%}
{%- endfor -%}
{%- elif content is defined and content is not none -%}
{{- content | string -}}
{%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages and messages[0].role in ['system', 'developer'] -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if first_is_system -%}
{{- text(messages[0].content) + '\n\n' -}}
{%- endif -%}
{{- '# Tools\n\nThese functions are available. Their JSON signatures are listed inside '
    '<tools></tools>, one per line:\n<tools>' -}}
{%- for tool in tools -%}
{{- '\n' + (tool | tojson) -}}
{%- endfor -%}
{{- '\n</tools>\n\nTo call functions, write one block per call:\n<tool_call>\n'
    '{"name": <function name>, "arguments": <JSON object of arguments>}\n'
    '</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role in ['system', 'developer'] -%}
{%- if not (loop.first and tools) -%}
{{- '<|im_start|>system\n' + text(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- elif message.role == 'user' -%}
{{- '<|im_start|>user\n' + text(message.content) + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- generation -%}
{%- set body = text(message.content) -%}
{{- body -}}
{%- for call in (message.tool_calls or []) -%}
{%- if call.function is defined -%}
{%- set call = call.function -%}
{%- endif -%}
{%- if body or not loop.first -%}
{{- '\n' -}}
{%- endif -%}
{{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' -}}
{%- if call.arguments is string -%}
{{- call.arguments if call.arguments | trim else '{}' -}}
{%- elif call.arguments is defined and call.arguments is not none -%}
{{- call.arguments | tojson -}}
{%- else -%}
{{- '{}' -}}
{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>' -}}
{%- endgeneration -%}
{{- '\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- else -%}
{{- raise_exception('Unknown message role ' ~ message.role
                     ~ '; expected system, developer, user, assistant or tool.') -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""
