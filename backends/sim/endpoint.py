"""One simulated server as the HTTP layer sees it: its role, engine, faults, metrics and lifecycle.

Output length: a request runs to its `max_tokens` (chat: `max_completion_tokens`, else `max_tokens`;
completions default to 16 as in OpenAI and SGLang) and ends with `finish_reason: "length"`. A chat
request without either field ends where the simulated model emits EOS: after the profile's
`default_max_tokens` tokens, with `finish_reason: "stop"` and the profile's `eos_token_id` as
`matched_stop`. With `ignore_eos` and no limit it runs, as in SGLang, to the context length minus
the prompt. A stop string ends it early with `finish_reason: "stop"` and `matched_stop` set to it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from starlette.responses import Response

from backends.sim import vocab
from backends.sim.chat_extras import ExtrasChatRenderer, wants_extras
from backends.sim.choices import ChoicesResponse
from backends.sim.engine import Engine
from backends.sim.faults import FaultState
from backends.sim.layout import ServerSlot
from backends.sim.metrics import SimMetrics
from backends.sim.profiles import Profile, Role, RoleProfile
from backends.sim.protocol import ChatCompletionRequest, CompletionRequest
from backends.sim.render import ChatRenderer, CompletionRenderer, Renderer
from backends.sim.request import RequestError, SimRequest, check_context
from backends.sim.responses import GenerationResponse
from backends.sim.settings import SimSettings
from backends.sim.tokenizer import chat_prompt_ids, chat_prompt_key

Status = Literal["starting", "up", "draining"]

SGLANG_VERSION = "0.5.23"

RendererFactory = Callable[[SimRequest, str], Renderer]  # (request, model) -> its renderer


@dataclass
class Endpoint:
    """A role served on one port."""

    role: Role
    host: str
    port: int
    profile: Profile
    table: RoleProfile
    slot: ServerSlot
    settings: SimSettings
    engine: Engine
    faults: FaultState
    metrics: SimMetrics | None
    served_model_name: str
    launch_command: str
    started_at: float = field(default_factory=time.time)
    status: Status = "starting"

    @property
    def ready(self) -> bool:
        """What `/ready` and `/health` report: up, and neither draining nor told to act so."""
        return self.status == "up" and not self.faults.draining

    @property
    def speculative_algorithm(self) -> str | None:
        """SGLang's `speculative_algorithm` for this role."""
        return "EAGLE3" if self.table.speculative else None

    def start_generation(
        self,
        body: ChatCompletionRequest | CompletionRequest,
        renderer: RendererFactory | None = None,
        *,
        include_usage: bool | None = None,
        trace_headers: dict[str, str] | None = None,
    ) -> Response:
        """Validate `body`, queue it in the engine and return the response that will carry its output.

        `renderer` answers in another API's shape (Responses, Ollama), whose usage is reported
        when `include_usage` says so rather than by the body's `stream_options`. `trace_headers`:
        the request's W3C trace context, kept on it (SGLang parents its spans on it).
        """
        if body.n != 1:
            return self._start_choices(body)
        req, default = self._build(body)
        req.trace_headers = trace_headers or {}
        self.engine.submit(req, hold_seconds=self.faults.first_token_delay)
        return GenerationResponse(
            self.engine,
            req,
            default if renderer is None else renderer(req, body.model),
            include_usage=body.include_usage() if include_usage is None else include_usage,
            spec_details=self.table.num_draft_tokens
            if body.return_spec_tokens_details and self.table.speculative
            else None,
            cache_report=self.settings.enable_cache_report,
            faults=self.faults.stream_faults(),
        )

    def _start_choices(self, body: ChatCompletionRequest | CompletionRequest) -> Response:
        """A chat request for `n` > 1 choices: n requests in the engine, one response."""
        if not isinstance(body, ChatCompletionRequest):
            raise RequestError("n > 1 is supported by the simulated server on chat completions only")
        if not 1 <= body.n <= 128:
            raise RequestError("n must be between 1 and 128")
        first, _ = self._build(body)
        reqs = [first] + [self._build(body, choice=i)[0] for i in range(1, body.n)]
        for req in reqs:
            self.engine.submit(req, hold_seconds=self.faults.first_token_delay)
        renderers = [ExtrasChatRenderer(first.rid, int(first.created), body.model, body, i) for i in range(body.n)]
        return ChoicesResponse(
            self.engine,
            reqs,
            renderers,
            stream=body.stream,
            include_usage=body.include_usage(),
            cache_report=self.settings.enable_cache_report,
        )

    def _build(self, body: ChatCompletionRequest | CompletionRequest, choice: int = 0) -> tuple[SimRequest, Renderer]:
        """The engine request for `body` (its choice number `choice`, whose text differs) and its renderer."""
        if isinstance(body.rid, list) and len(body.rid) != 1:
            raise RequestError("a list of rid (a batched request) is not supported by the simulated server")
        if isinstance(body, ChatCompletionRequest):
            if not body.messages:
                raise RequestError("Messages cannot be empty.")
            messages, continued = body.prompt_messages()
            prompt_ids = chat_prompt_ids(messages)
            prompt_key = chat_prompt_key(messages)
            if continued:
                prompt_ids = prompt_ids + vocab.encode(continued)
            prefix = "chatcmpl-"
        else:
            prompt_ids, prompt_key = _completion_prompt(body.prompt)
            prefix, continued = "cmpl-", None
        prompt_tokens = len(prompt_ids)
        limit = self.profile.context_length
        check_context(prompt_tokens, 0, limit)
        requested = body.requested_max_tokens()
        natural_stop = None
        if requested is not None:
            max_new = requested
        elif body.ignore_eos:
            max_new = limit - prompt_tokens
        else:
            max_new = min(self.profile.default_max_tokens, limit - prompt_tokens)
            natural_stop = self.profile.eos_token_id
        check_context(prompt_tokens, max_new, limit)
        req = SimRequest(
            rid=f"{body.request_id() or prefix + uuid.uuid4().hex}{f'-{choice}' if choice else ''}",
            prompt_ids=prompt_ids,
            max_new_tokens=max_new,
            is_streaming=body.stream,
            text_start=self._text_start(prompt_key if not choice else f"{prompt_key}#{choice}", continued),
            stop=body.stop_strings(),
            natural_stop=natural_stop,
        )
        if isinstance(body, ChatCompletionRequest) and wants_extras(body):
            return req, ExtrasChatRenderer(req.rid, int(req.created), body.model, body)
        renderer_class = ChatRenderer if isinstance(body, ChatCompletionRequest) else CompletionRenderer
        return req, renderer_class(req.rid, int(req.created), body.model)

    def _text_start(self, prompt_key: str, continued: str | None) -> int:
        """Where the output starts: the prompt's own place in the text, or, for an answer continued
        (`continue_final_message`), just past the text given when it is how this prompt's output
        begins (a greedy model continues its own answer), else a place of the text given's own."""
        text = self.engine.text
        start = text.start_for(prompt_key)
        if not continued:
            return start
        given = len(vocab.encode(continued))
        if text.text(start, 0, given) == continued:
            return (start + given) % text.length
        return text.start_for(prompt_key + continued)


def _completion_prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> tuple[list[int], str]:
    """Prompt token ids and the text key of a completions prompt (a string, one string, or token ids)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("Prompt cannot be empty")
        return vocab.encode(prompt), prompt
    if not prompt:
        raise RequestError("Prompt cannot be empty")
    if all(isinstance(t, int) for t in prompt):
        ids = cast(list[int], prompt)
        return ids, ",".join(str(t) for t in ids)
    raise RequestError("a list of prompts (a batched request) is not supported by the simulated server")
