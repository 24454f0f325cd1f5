"""legorl_jax.proxy: the token-faithful LLM API proxy between native harnesses and the policy.

OpenAI Chat Completions, OpenAI Responses and Anthropic Messages requests are converted to one
neutral conversation, rendered with the tokenizer's chat template (splicing in the exact ids
sampled for assistant turns the harness sends back), sampled through a ``PolicyBackend`` and
recorded per session as training segments.
"""

from legorl_jax.proxy.backend import EngineBackend, PolicyBackend, ScriptedBackend
from legorl_jax.proxy.recorder import CallRecord, Segment, Session, SessionStore
from legorl_jax.proxy.render import ChatRenderer
from legorl_jax.proxy.server import ProxyServer, SessionHandle
from legorl_jax.proxy.service import ProxyConfig, ProxyService
from legorl_jax.proxy.streams import MAIN, default_stream_classifier
from legorl_jax.proxy.types import Message, RenderedRequest, Reply, ToolCall, ToolSpec

__all__ = ["MAIN", "CallRecord", "ChatRenderer", "EngineBackend", "Message", "PolicyBackend",
           "ProxyConfig", "ProxyServer", "ProxyService", "RenderedRequest", "Reply",
           "ScriptedBackend", "Segment", "Session", "SessionHandle", "SessionStore", "ToolCall",
           "ToolSpec", "default_stream_classifier"]
