"""SGLang's native `/generate` on the simulator, shaped as SGLang 0.5.23 answers it.

A body gives `text` or `input_ids`, one prompt or a batch, `sampling_params` (a dict or one per
prompt: `max_new_tokens` default 128, `stop`, `ignore_eos`, `n`, ...), `stream`, `rid`,
`return_logprob` (+ `logprob_start_len`, `top_logprobs_num`). Each of prompts x n sequences is one
engine request; a string `rid` of a batch becomes `rid_0`, `rid_1`, ... as in SGLang.

The answer is `{"text", "output_ids", "meta_info"}` per sequence (a list for a batch). A stream sends
one such event per engine step that produced tokens, with the text and ids so far (SGLang's
default, non-incremental streaming), a batch's events tagged with `index`, then `data: [DONE]`.
`meta_info` carries `id`, `finish_reason` (`{"type": "length", "length"}`, `{"type": "stop",
"matched"}`, `{"type": "abort", ...}` or null while running), `prompt_tokens`, `completion_tokens`,
`cached_tokens`, ..., and once finished `e2e_latency` and, on a speculative server, the
speculation figures. Refusals are SGLang's `{"error": {"message"}}` with 400.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from backends.sim import vocab
from backends.sim.protocol import ChatCompletionRequest
from backends.sim.request import RequestError, SimRequest
from backends.sim.tokenizer import chat_prompt_ids

if TYPE_CHECKING:
    from backends.sim.endpoint import Endpoint

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
_DONE = b"data: [DONE]\n\n"
_LOGPROB = -0.25  # the simulated model is fairly sure of every token it writes


def native_error(message: str, status: int = 400) -> Response:
    """SGLang's error body on its native routes."""
    return Response(orjson.dumps({"error": {"message": message}}), status_code=status, media_type="application/json")


@dataclass
class _Sequence:
    """One engine request of a native call and what its output must carry."""

    req: SimRequest
    prompt_ids: list[int]
    logprob: bool
    logprob_start: int
    top_logprobs: int


def _prompts(body: dict[str, Any]) -> tuple[list[tuple[str, list[int]]], bool]:
    """(text key, token ids) per prompt, and whether the body is a batch."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a non-empty list of strings")
        return [(t, vocab.encode(t)) for t in texts], not isinstance(text, str)
    if ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if not isinstance(ids, list) or not ids:
        raise RequestError("input_ids cannot be empty.")
    rows = [ids] if isinstance(ids[0], int) else ids
    for row in rows:
        if not isinstance(row, list) or not row or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
            raise RequestError("input_ids must be a list of token ids or a list of such lists")
    return [(",".join(map(str, row)), row) for row in rows], isinstance(ids[0], list)


def _per_prompt(value: Any, count: int, default: Any) -> list[Any]:
    if value is None:
        return [default] * count
    return list(value) if isinstance(value, list) else [value] * count


def _rids(rid: Any, count: int, batched: bool) -> list[str | None]:
    if rid is None:
        return [None] * count
    if isinstance(rid, str):
        return [rid] if not batched else [f"{rid}_{i}" for i in range(count)]
    if isinstance(rid, list) and len(rid) == count and all(isinstance(r, str) for r in rid):
        if len(set(rid)) != len(rid):
            raise RequestError(f"Duplicate request IDs detected within the request: {rid}")
        return list(rid)
    raise RequestError("The specified rids length mismatch with the batch_size for batch processing.")


def _stops(params: dict[str, Any]) -> tuple[str, ...]:
    stop = params.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    return tuple(s for s in stops if isinstance(s, str) and s)


class NativeCall:
    """Builds the engine requests of one `/generate` body and the response that carries them."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep

    def start(self, body: Any) -> Response:
        """Queue every sequence of `body`; raises `RequestError` for a body SGLang refuses."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        prompts, batched = _prompts(body)
        params = _per_prompt(body.get("sampling_params"), len(prompts), {})
        if len(params) != len(prompts) or not all(isinstance(p, dict) for p in params):
            raise RequestError("sampling_params must be an object or one object per prompt")
        n = params[0].get("n", 1) if params else 1
        if any(p.get("n", 1) != n for p in params):
            raise RequestError("The parallel_sample_num should be the same for all samples in sample params.")
        if not isinstance(n, int) or n < 1:
            raise RequestError("n must be a positive integer")
        batched = batched or n > 1
        logprob = _per_prompt(body.get("return_logprob"), len(prompts), False)
        start_len = _per_prompt(body.get("logprob_start_len"), len(prompts), -1)
        top = _per_prompt(body.get("top_logprobs_num"), len(prompts), 0)
        # SGLang orders a parallel-sampled batch prompt-major within each sample round.
        order = [i for _ in range(n) for i in range(len(prompts))]
        rids = _rids(body.get("rid"), len(order), batched)
        stream = bool(body.get("stream"))
        sequences = []
        for k, (i, rid) in enumerate(zip(order, rids, strict=True)):
            start = int(start_len[i] if start_len[i] is not None else -1)
            # SGLang computes input logprobs from logprob_start_len on, so the cache may not serve those tokens.
            cap = start if logprob[i] and start >= 0 else None
            req = self._request(prompts[i], params[i], stream, rid, sample=k // len(prompts), prefix_cap=cap)
            sequences.append(_Sequence(req, prompts[i][1], bool(logprob[i]), start, int(top[i] or 0)))
        submitted: list[SimRequest] = []
        try:
            for seq in sequences:
                self.ep.engine.submit(seq.req, hold_seconds=self.ep.faults.first_token_delay)
                submitted.append(seq.req)
        except RequestError:
            for req in submitted:
                self.ep.engine.abort(req)
            raise
        return NativeResponse(self.ep, sequences, batched=batched)

    def _request(
        self,
        prompt: tuple[str, list[int]],
        params: dict[str, Any],
        stream: bool,
        rid: str | None,
        *,
        sample: int,
        prefix_cap: int | None,
    ) -> SimRequest:
        key, prompt_ids = prompt
        prompt_tokens = len(prompt_ids)
        key = key if sample == 0 else f"{key}\x00{sample}"  # each of n samples writes its own text
        limit = self.ep.profile.context_length
        if prompt_tokens >= limit:
            raise RequestError(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length ({limit} tokens)."
            )
        requested = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if requested is None:
            requested = limit - prompt_tokens
        if not isinstance(requested, int) or isinstance(requested, bool) or requested < 0:
            raise RequestError("max_new_tokens must be a non-negative integer")
        max_new = min(requested, limit - prompt_tokens)
        natural_stop = None
        if not params.get("ignore_eos") and self.ep.profile.default_max_tokens < max_new:
            max_new, natural_stop = self.ep.profile.default_max_tokens, self.ep.profile.eos_token_id
        return SimRequest(
            rid=rid or uuid.uuid4().hex,
            prompt_ids=prompt_ids,
            max_new_tokens=max(max_new, 1),
            is_streaming=stream,
            text_start=self.ep.engine.text.start_for(key),
            stop=_stops(params),
            natural_stop=natural_stop,
            prefix_cap=prefix_cap,
        )


def _finish(req: SimRequest) -> dict[str, Any] | None:
    if not req.done:
        return None
    if req.finish_reason == "length":
        return {"type": "length", "length": req.max_new_tokens}
    if req.finish_reason == "stop":
        return {"type": "stop", "matched": req.matched_stop}
    return {"type": "abort", "message": "Abort in waiting queue" if req.produced == 0 else "Abort request",
            "status_code": None, "err_type": None}


class NativeResponse(Response):
    """Streams (or returns whole) the outputs of one native call; a client that leaves aborts them all."""

    def __init__(self, ep: Endpoint, sequences: list[_Sequence], *, batched: bool) -> None:
        self.ep = ep
        self.sequences = sequences
        self.batched = batched
        self.status_code = 200
        self.background = None
        self.client_gone = False
        self._gone = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            if self.sequences[0].req.is_streaming:
                await self._stream(send)
            else:
                await self._complete(send)
        except OSError:
            pass  # the client went away while we were writing
        finally:
            watcher.cancel()
            for seq in self.sequences:
                self.ep.engine.abort(seq.req)

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.client_gone = True
        self._gone.set()
        for seq in self.sequences:
            self.ep.engine.abort(seq.req)

    async def _wait_any(self, pending: list[_Sequence]) -> None:
        """Until one of `pending` has news (or the client left)."""
        if len(pending) == 1:
            await pending[0].req.event.wait()
            return
        waiters = [asyncio.ensure_future(s.req.event.wait()) for s in pending]
        waiters.append(asyncio.ensure_future(self._gone.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    def _output(self, seq: _Sequence, index: int | None) -> dict[str, Any]:
        req = seq.req
        text = self.ep.engine.text.text(req.text_start, 0, req.produced)
        if req.text_limit is not None:
            text = text[: req.text_limit]
        ids = self.ep.engine.text.token_ids(req.text_start, 0, req.produced)
        out: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": self._meta(seq, ids)}
        if index is not None:
            out["index"] = index
        return out

    def _meta(self, seq: _Sequence, ids: list[int]) -> dict[str, Any]:
        req = seq.req
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": _finish(req),
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        if seq.logprob:
            meta.update(_logprobs(seq, ids))
        meta.update({"reasoning_tokens": 0, "completion_tokens": req.produced, "cached_tokens": req.cached_tokens})
        if req.done:
            meta["e2e_latency"] = (req.finished_at or time.time()) - req.created
            drafts = self.ep.table.num_draft_tokens
            if self.ep.table.speculative and req.verify_steps > 0 and drafts > 1:
                proposed = req.verify_steps * (drafts - 1)
                correct = max(req.produced - req.verify_steps, 0)
                meta.update(
                    {
                        "spec_accept_rate": correct / proposed,
                        "spec_accept_length": req.produced / req.verify_steps,
                        "spec_num_correct_drafts": correct,
                        "spec_num_proposed_drafts": proposed,
                        "spec_verify_ct": req.verify_steps,
                    }
                )
        return meta

    async def _stream(self, send: Send) -> None:
        sent = {id(s): -1 for s in self.sequences}
        started = False
        while True:
            pending = [s for s in self.sequences if sent[id(s)] != -2]
            if not pending or self.client_gone:
                break
            await self._wait_any(pending)
            body = b""
            for index, seq in enumerate(self.sequences):
                req = seq.req
                req.event.clear()
                if sent[id(seq)] == -2 or (req.produced == sent[id(seq)] and not req.done):
                    continue
                sent[id(seq)] = -2 if req.done else req.produced
                body += b"data: " + orjson.dumps(self._output(seq, index if self.batched else None)) + b"\n\n"
            if not body or self.client_gone:
                continue
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                started = True
            await send({"type": "http.response.body", "body": body, "more_body": True})
        if self.client_gone:
            return
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": _DONE, "more_body": False})

    async def _complete(self, send: Send) -> None:
        while not self.client_gone:
            pending = [s for s in self.sequences if not s.req.done]
            if not pending:
                break
            await self._wait_any(pending)
            for s in pending:
                s.req.event.clear()
        if self.client_gone:
            return
        outputs = [self._output(s, None) for s in self.sequences]
        body = orjson.dumps(outputs if self.batched else outputs[0])
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _logprobs(seq: _Sequence, ids: list[int]) -> dict[str, Any]:
    """SGLang's logprob fields: (logprob, token id, text or None) per position."""
    prompt = seq.prompt_ids
    start = len(prompt) - 1 if seq.logprob_start < 0 else min(seq.logprob_start, len(prompt))
    inputs = [[None if i == 0 else _LOGPROB, tid, None] for i, tid in enumerate(prompt) if i >= start]
    outputs = [[_LOGPROB, tid, None] for tid in ids]
    meta: dict[str, Any] = {
        "input_token_logprobs": inputs,
        "output_token_logprobs": outputs,
        "output_token_logprobs_length": len(outputs),
    }
    if seq.top_logprobs > 0:
        def top(tid: int | None) -> list[list[Any]]:
            return [[_LOGPROB * (k + 1), tid if k == 0 else vocab.FIRST_WORD_ID + k, None] for k in range(seq.top_logprobs)]

        meta["input_top_logprobs"] = [None if i == 0 else top(row[1]) for i, row in enumerate(inputs)]
        meta["output_top_logprobs"] = [top(tid) for tid in ids]
    return meta


def tokenize(ep: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's `TokenizeResponse` for a `prompt` string or list of strings, or for chat `messages` rendered
    as a chat completion renders them (`continue_final_message` included)."""
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise RequestError("Exactly one of 'prompt' or 'messages' must be provided.")
    if messages is not None:
        try:
            chat = ChatCompletionRequest.model_validate({"messages": messages, "continue_final_message": body.get("continue_final_message", False)})
        except ValidationError as exc:
            raise RequestError(f"invalid messages: {exc.errors()[0].get('msg', 'invalid')}") from None
        rendered, continued = chat.prompt_messages()
        ids = chat_prompt_ids(rendered) + (vocab.encode(continued) if continued else [])
        return {"tokens": ids, "count": len(ids), "max_model_len": ep.profile.context_length}
    if isinstance(prompt, str):
        ids = vocab.encode(prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": ep.profile.context_length}
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        rows = [vocab.encode(p) for p in prompt]
        return {"tokens": rows, "count": [len(r) for r in rows], "max_model_len": ep.profile.context_length}
    raise RequestError("prompt must be a string or a list of strings")


def detokenize(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's `DetokenizeResponse` for `tokens` (a list of ids, or a list of such lists)."""
    tokens = body.get("tokens")
    if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
        return {"text": vocab.decode(tokens)}
    if isinstance(tokens, list) and all(isinstance(r, list) and all(isinstance(t, int) for t in r) for r in tokens):
        return {"text": [vocab.decode(r) for r in tokens]}
    raise RequestError("tokens must be a list of token ids or a list of such lists")
