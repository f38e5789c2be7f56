"""SGLang's native `/generate` as the proxy sees it (sglang/srt/managers/io_struct.py `GenerateReqInput`).

A body carries `text` or `input_ids`, one prompt or a batch (a list of strings, a list of id lists);
`sampling_params` (a dict, or one per prompt) may ask for `n` samples each, so upstream runs
prompts x n sequences: that is the request's weight in flight. Token counts live in each output's
`meta_info` (`prompt_tokens`, `completion_tokens`, `finish_reason`); a streamed event repeats the
counts so far, and a batched stream tags each event with the `index` of its sequence. Errors keep
SGLang's own shape on this route (`{"error": {"message": ...}}`), so an upstream error body is
relayed as it came.
"""

from __future__ import annotations

import array
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.dialects.openai import Dialect, positive_int
from gateway.errors import OpenAIError
from gateway.relay import ChunkReader

MAX_WEIGHT = 4096  # sequences one request may run upstream; far beyond any batch SGLang schedules at once


class NativeInputError(ValueError):
    """A `/generate` body SGLang would refuse before generating."""


@dataclass(frozen=True)
class NativeRequest:
    """What the gateway must know of a `/generate` body."""

    prompts: int  # 1 for a single prompt
    samples: int  # `n` per prompt
    batched: bool
    stream: bool
    rids: tuple[str, ...]  # the client's request ids, if it named any

    @property
    def weight(self) -> int:
        """Sequences the request runs upstream."""
        return self.prompts * self.samples

    def upstream_rids(self, default: str) -> tuple[str, ...]:
        """The ids SGLang knows the sequences by: the client's, else `default`; one id of a batch
        becomes `id_0`, `id_1`, ... as SGLang expands it."""
        rids = self.rids or (default,)
        if self.batched and len(rids) == 1:
            return tuple(f"{rids[0]}_{i}" for i in range(self.weight))
        return rids


def parse_native(body: Any) -> NativeRequest:
    """Check a decoded `/generate` body the way SGLang normalizes it; raise `NativeInputError` if it would not."""
    if not isinstance(body, dict):
        raise NativeInputError("the request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        if body.get("input_embeds") is not None:
            raise NativeInputError("input_embeds are not supported through the gateway; send text or input_ids")
        raise NativeInputError("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        prompts, batched = _text_prompts(text)
    else:
        prompts, batched = _id_prompts(ids)
    samples = _samples(body.get("sampling_params"), prompts if batched else 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise NativeInputError("stream must be a boolean")
    rid = body.get("rid")
    if rid is None:
        rids: tuple[str, ...] = ()
    elif isinstance(rid, str):
        rids = (rid,)
    elif isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        rids = tuple(rid)
    else:
        raise NativeInputError("The rid should be a string or a list of strings.")
    if prompts * samples > MAX_WEIGHT:
        raise NativeInputError(f"a request may run at most {MAX_WEIGHT} sequences (prompts x n)")
    return NativeRequest(prompts, samples, batched or samples > 1, stream, rids)


def _text_prompts(text: Any) -> tuple[int, bool]:
    if isinstance(text, str):
        return 1, False
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return len(text), True
    raise NativeInputError("text must be a string or a non-empty list of strings")


def _id_prompts(ids: Any) -> tuple[int, bool]:
    if not isinstance(ids, list) or not ids:
        raise NativeInputError("input_ids cannot be empty.")
    if all(_token_id(t) for t in ids):
        return 1, False
    if all(isinstance(row, list) and row and all(_token_id(t) for t in row) for row in ids):
        return len(ids), True
    raise NativeInputError("input_ids must be a list of token ids or a list of such lists")


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _samples(params: Any, prompts: int) -> int:
    """`n` of the sampling params (SGLang requires one `n` for the whole batch)."""
    if params is None:
        return 1
    items = params if isinstance(params, list) else [params]
    if not all(isinstance(p, dict) for p in items):
        raise NativeInputError("sampling_params must be an object or a list of objects")
    if isinstance(params, list) and len(params) != prompts:
        raise NativeInputError("sampling_params must have one entry per prompt")
    counts = {p.get("n", 1) for p in items} or {1}
    if len(counts) > 1:
        raise NativeInputError("The parallel_sample_num should be the same for all samples in sample params.")
    n = counts.pop()
    if not positive_int(n):
        raise NativeInputError("sampling_params.n must be a positive integer")
    return int(n)


class NativeChunkReader:
    """Reads one `/generate` stream: counts per sequence, summed; new tokens when a sequence's count grows."""

    def __init__(self) -> None:
        self._prompt: dict[int, int] = {}
        self._completion: dict[int, int] = {}
        self._cached: dict[int, int] = {}

    def __call__(self, chunk: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        meta = chunk.get("meta_info")
        if not isinstance(meta, dict):
            return None, False
        index = chunk.get("index", 0)
        index = index if isinstance(index, int) else 0
        before = self._completion.get(index, 0)
        self._completion[index] = _count(meta.get("completion_tokens"))
        self._prompt[index] = _count(meta.get("prompt_tokens"))
        self._cached[index] = _count(meta.get("cached_tokens"))
        usage = {
            "prompt_tokens": sum(self._prompt.values()),
            "completion_tokens": sum(self._completion.values()),
            "prompt_tokens_details": {"cached_tokens": sum(self._cached.values())},
        }
        return usage, self._completion[index] > before


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class RelayedError(OpenAIError):
    """An upstream error whose body reaches the client as it came (SGLang's own shape on /generate)."""

    def __init__(self, status: int, payload: bytes) -> None:
        super().__init__(status, "upstream error", code="upstream_error")
        self._payload = payload

    def body(self) -> bytes:
        return self._payload


class NativeDialect(Dialect):
    """SGLang's `/generate`."""

    def max_tokens(self, body: dict[str, Any]) -> int | None:
        """`sampling_params.max_new_tokens` (the largest of a batch's)."""
        params = body.get("sampling_params")
        items = params if isinstance(params, list) else [params]
        limits = [p.get("max_new_tokens") for p in items if isinstance(p, dict)]
        valid = [v for v in limits if positive_int(v)]
        return max(valid) if valid and len(valid) == len(items) else None

    def upstream_body(
        self, body: dict[str, Any], *, served_model: str | None, stream: bool, client_wants_usage: bool, request_id: str
    ) -> dict[str, Any]:
        """The body as the client sent it, plus a `rid` (a batch's items become `rid_0`, `rid_1`, ...)."""
        if body.get("rid") is not None:
            return body
        return {**body, "rid": request_id}

    def prompt_text(self, body: dict[str, Any]) -> bytes | None:
        """One prompt's text, or its token ids as 4-byte integers; None for a batch."""
        text, ids = body.get("text"), body.get("input_ids")
        if isinstance(text, str):
            return text.encode("utf-8", "surrogatepass")
        if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
            return array.array("I", (i & 0xFFFFFFFF for i in ids)).tobytes()
        return None

    def usage(self, response: Any) -> dict[str, Any] | None:
        """Summed `meta_info` counts of one output or a batch's list of outputs."""
        outputs = response if isinstance(response, list) else [response]
        prompt = completion = cached = 0
        for out in outputs:
            meta = out.get("meta_info") if isinstance(out, dict) else None
            if not isinstance(meta, dict):
                raise ValueError("an output without meta_info")
            prompt += _count(meta.get("prompt_tokens"))
            completion += _count(meta.get("completion_tokens"))
            cached += _count(meta.get("cached_tokens"))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": cached}}

    def chunk_reader(self) -> ChunkReader:
        return NativeChunkReader()

    def upstream_error(self, status: int, payload: bytes) -> OpenAIError:
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError:
            return super().upstream_error(status, payload)
        return RelayedError(status, payload)


NATIVE = NativeDialect()
