"""A started stream continued on another backend: the request that goes on with it there, and its usage.

A stream that moves ends on its backend between two token events (`relay.Handoff`) and its text so
far is given back to the new backend, which goes on from it (chat: `continue_final_message`;
completions: the prompt extended) with the rest of the output limit. The new backend's
`/v1/tokenize` counts the tokens given back (the continued prompt's count less the original's), so
the client's usage reads as one answer's: the original prompt, and every token generated on either
backend as completion.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.pool.backends import Backend
from gateway.proxy.job import ProxyJob
from gateway.upstream.client import UpstreamClient
from gateway.upstream.errors import LocalResourceError, WireError


@dataclass(frozen=True)
class Continuation:
    """The request that goes on with an answer on another backend, and how its usage reads."""

    body: bytes  # encoded for the backend it goes to
    prompt_tokens: int  # the original prompt's, as that backend counts them
    given: int  # output tokens the answer had when it moved

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The continuation's usage as the client's answer's: the original prompt's tokens, the given
        and its own generated tokens as completion, cached tokens at most the original prompt."""
        completion = self.given + int(usage.get("completion_tokens") or 0)
        fixed = {**usage, "prompt_tokens": self.prompt_tokens, "completion_tokens": completion}
        fixed["total_tokens"] = self.prompt_tokens + completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            fixed["prompt_tokens_details"] = {**details, "cached_tokens": min(details["cached_tokens"], self.prompt_tokens)}
        return fixed


async def continuation(job: ProxyJob, backend: Backend, upstream: UpstreamClient, text: str) -> Continuation | None:
    """How `backend` goes on with `job`'s streamed answer, which has `text` so far (the job `continues`);
    None when its tokenizer does not answer."""
    body, original, continued = job.dialect.continuation(job.body, text)
    model = backend.served_model_name
    if model:
        original, continued = {**original, "model": model}, {**continued, "model": model}
    try:
        counts = await asyncio.gather(_count(upstream, original), _count(upstream, continued))
    except (OSError, TimeoutError, WireError, LocalResourceError, ValueError):  # no answer, or not a count
        return None
    prompt_tokens, total = counts
    given = max(total - prompt_tokens, 0)
    limited = job.dialect.with_limit(body, given)
    sent = job.dialect.upstream_body(
        limited, served_model=model, stream=True, client_wants_usage=job.client_wants_usage, request_id=job.request_id
    )
    return Continuation(orjson.dumps(sent), prompt_tokens, given)


async def _count(upstream: UpstreamClient, body: dict[str, Any]) -> int:
    """The token count SGLang's `/v1/tokenize` gives `body`."""
    status, payload, _ = await upstream.fetch("/v1/tokenize", orjson.dumps(body), 0.0)
    count = orjson.loads(payload).get("count") if status == 200 else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise ValueError(f"/v1/tokenize answered {status} without a count")
    return count
