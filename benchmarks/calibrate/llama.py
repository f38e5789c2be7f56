"""A Llama-shaped decoder and an EAGLE-3-shaped draft head with random weights, for timing steps.

No checkpoint is loaded: a step's time depends on the shapes, not on the values. Shapes come from a
Hugging Face config.json. The KV cache is contiguous, one [batch, kv_heads, context, head_dim] tensor
per layer for keys and one for values, sized for the largest batch. A step of q tokens per request
writes its keys and values over the cache's last q positions and attends to all `context` of them,
so every step reads as much KV per request as a decode step at that context length does.

Only PyTorch and the standard library are imported: this module runs on GPU machines where the
project's own dependencies are not installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.calibrate.shape import LlamaShape

# EAGLE-3 heads for Llama-3.1-8B predict over a reduced vocabulary of 32,000 tokens.
DEFAULT_DRAFT_VOCAB = 32000


@dataclass(frozen=True)
class _Layer:
    norm_attn: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    norm_mlp: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


class Decoder:
    """Random-weight target model plus EAGLE-3 draft head, with KV caches for `max_batch` requests."""

    def __init__(
        self,
        shape: LlamaShape,
        *,
        context: int,
        max_batch: int,
        draft_vocab: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
        compile_layers: bool = False,
    ) -> None:
        self.shape = shape
        self.context = context
        self.draft_vocab = min(draft_vocab, shape.vocab)  # draft tokens index the shared embedding
        self.device = device
        self.dtype = dtype
        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*size: int) -> torch.Tensor:
            return (torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

        def layer(attn_in: int) -> _Layer:
            s = shape
            return _Layer(
                norm_attn=torch.ones(attn_in, device=device, dtype=dtype),
                wqkv=rand((s.heads + 2 * s.kv_heads) * s.head_dim, attn_in),
                wo=rand(s.hidden, s.heads * s.head_dim),
                norm_mlp=torch.ones(s.hidden, device=device, dtype=dtype),
                w_gate_up=rand(2 * s.intermediate, s.hidden),
                w_down=rand(s.hidden, s.intermediate),
            )

        def cache() -> torch.Tensor:
            return rand(max_batch, shape.kv_heads, context, shape.head_dim)

        self.embed = rand(shape.vocab, shape.hidden)
        self.layers = [layer(shape.hidden) for _ in range(shape.layers)]
        self.final_norm = torch.ones(shape.hidden, device=device, dtype=dtype)
        self.lm_head = rand(shape.vocab, shape.hidden)
        self.k_cache = [cache() for _ in range(shape.layers)]
        self.v_cache = [cache() for _ in range(shape.layers)]
        # The draft head: fc fuses three target layers' features; its layer reads [embedding, hidden].
        self.draft_fc = rand(shape.hidden, 3 * shape.hidden)
        self.draft_layer = layer(2 * shape.hidden)
        self.draft_norm = torch.ones(shape.hidden, device=device, dtype=dtype)
        self.draft_lm_head = rand(self.draft_vocab, shape.hidden)
        self.draft_k, self.draft_v = cache(), cache()
        # Target layers whose outputs EAGLE-3 fuses (low, middle, high), as its reference code picks them.
        # (Clamped, so a model of a few layers may fuse one layer's output twice.)
        last = shape.layers - 1
        self.feature_layers = (min(2, last), shape.layers // 2, max(shape.layers - 3, 0))
        self._rope_cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._project_fn, self._finish_fn = self._project, self._finish
        if compile_layers:
            # Compiled, the work around attention (norms, rotary, SiLU, residual adds) fuses into a few
            # kernels, as in a serving engine's hand-fused ones; eager PyTorch runs about twice as many.
            # Attention and the KV cache writes stay eager, so the cache is written in place.
            torch._dynamo.config.recompile_limit = 64  # one compile per layer kind, q_len, batch 1 or more
            self._project_fn = torch.compile(self._project, fullgraph=True)
            self._finish_fn = torch.compile(self._finish, fullgraph=True)

    def _rope_tables(self, start: int, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin over the full head dim for positions start..start+q_len, computed once per shape."""
        key = (start, q_len)
        if key not in self._rope_cache:
            half = self.shape.head_dim // 2
            inv_freq = self.shape.rope_theta ** (-torch.arange(half, device=self.device, dtype=torch.float32) / half)
            angles = torch.arange(start, start + q_len, device=self.device, dtype=torch.float32)[:, None] * inv_freq
            angles = torch.cat((angles, angles), dim=-1)[None, :, None, :]
            self._rope_cache[key] = (angles.cos().to(self.dtype), angles.sin().to(self.dtype))
        return self._rope_cache[key]

    def _rope(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotary embedding of [batch, q_len, heads, head_dim] (queries and keys together, one pass)."""
        cos, sin = rope
        half = self.shape.head_dim // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return torch.addcmul(x * cos, rotated, sin)

    def _project(
        self, layer: _Layer, attn_in: torch.Tensor, batch: int, q_len: int, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, QKV projection and rotary: q [batch, q_len, heads, dim], k and v [batch, kv_heads, q_len, dim]."""
        s = self.shape
        h = F.rms_norm(attn_in, (attn_in.shape[-1],), layer.norm_attn, s.rms_eps)
        qkv = F.linear(h, layer.wqkv)
        qk_width = (s.heads + s.kv_heads) * s.head_dim
        qk = self._rope(qkv[:, :qk_width].view(batch, q_len, s.heads + s.kv_heads, s.head_dim), rope)
        v = qkv[:, qk_width:].view(batch, q_len, s.kv_heads, s.head_dim).transpose(1, 2)
        return qk[:, :, : s.heads], qk[:, :, s.heads :].transpose(1, 2), v

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Attention output [batch * q_len, heads * dim]; `kv` None means a prefill attending to itself."""
        s = self.shape
        batch, q_len = q.shape[0], q.shape[1]
        group = s.heads // s.kv_heads
        if kv is None:
            # Prefill: causal over its own tokens; KV heads repeated for the query heads that share them.
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)
            return out.transpose(1, 2).reshape(batch * q_len, -1)
        k_all, v_all = kv[0][:batch], kv[1][:batch]
        k_all[:, :, self.context - q_len :] = k
        v_all[:, :, self.context - q_len :] = v
        # Decode: the query heads sharing a KV head are folded into its query rows (as decode kernels
        # do), so attention runs per KV head and any SDPA backend reads the cache once.
        q = q.reshape(batch, q_len, s.kv_heads, group, s.head_dim).permute(0, 2, 3, 1, 4)
        out = F.scaled_dot_product_attention(q.reshape(batch, s.kv_heads, group * q_len, s.head_dim), k_all, v_all)
        return out.view(batch, s.kv_heads, group, q_len, s.head_dim).permute(0, 3, 1, 2, 4).reshape(batch * q_len, -1)

    def _finish(self, layer: _Layer, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, norm and the gated MLP."""
        x = residual + F.linear(attn_out, layer.wo)
        h = F.rms_norm(x, (self.shape.hidden,), layer.norm_mlp, self.shape.rms_eps)
        gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.w_down)

    def _layer(
        self,
        layer: _Layer,
        residual: torch.Tensor,
        attn_in: torch.Tensor,
        batch: int,
        q_len: int,
        kv: tuple[torch.Tensor, torch.Tensor] | None,
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """One decoder layer over `batch * q_len` tokens."""
        q, k, v = self._project_fn(layer, attn_in, batch, q_len, rope)
        return self._finish_fn(layer, residual, self._attend(q, k, v, kv))

    def _target(self, tokens: torch.Tensor, batch: int, q_len: int, cached: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward: (hidden states of every token, the fused features of the feature layers)."""
        x = self.embed[tokens]
        features = []
        rope = self._rope_tables(self.context - q_len if cached else 0, q_len)
        for i, layer in enumerate(self.layers):
            kv = (self.k_cache[i], self.v_cache[i]) if cached else None
            x = self._layer(layer, x, x, batch, q_len, kv, rope)
            features.extend([x] * self.feature_layers.count(i))
        return x, torch.cat(features, dim=-1)

    def _logits(self, x: torch.Tensor, head: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        return F.linear(F.rms_norm(x, (self.shape.hidden,), norm, self.shape.rms_eps), head)

    def _draft(self, tokens: torch.Tensor, hidden: torch.Tensor, batch: int, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the draft head: (its hidden states, its greedy next tokens)."""
        attn_in = torch.cat((self.embed[tokens], hidden), dim=-1)
        rope = self._rope_tables(self.context - q_len, q_len)
        hidden = self._layer(self.draft_layer, hidden, attn_in, batch, q_len, (self.draft_k, self.draft_v), rope)
        return hidden, self._logits(hidden, self.draft_lm_head, self.draft_norm).argmax(-1)

    def plain_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """A decode step of one token for each of len(tokens) requests; returns the next tokens."""
        x, _ = self._target(tokens, tokens.shape[0], 1, cached=True)
        return self._logits(x, self.lm_head, self.final_norm).argmax(-1)

    def eagle_step(self, tokens: torch.Tensor, hidden: torch.Tensor, drafts: int) -> torch.Tensor:
        """An EAGLE-3 chain step: `drafts` draft passes, a verify of drafts+1 tokens, a draft extend.

        The draft extend runs the head over the verified tokens with the target's fused features,
        as SGLang does after each verify to fill the draft's KV and start the next chain.
        """
        batch = tokens.shape[0]
        chain = [tokens]
        token = tokens
        for _ in range(drafts):
            hidden, token = self._draft(token, hidden, batch, 1)
            chain.append(token)
        q_len = drafts + 1
        verify = torch.stack(chain, dim=1).reshape(batch * q_len)
        x, features = self._target(verify, batch, q_len, cached=True)
        accepted = self._logits(x, self.lm_head, self.final_norm).argmax(-1)
        _, nxt = self._draft(accepted, F.linear(features, self.draft_fc), batch, q_len)
        return nxt

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Prefill of one prompt; returns its first output token (logits of the last position only)."""
        x, _ = self._target(tokens, 1, tokens.shape[0], cached=False)
        return self._logits(x[-1:], self.lm_head, self.final_norm).argmax(-1)

    def eagle_prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """An EAGLE server's prefill batch of one prompt, as SGLang runs it: the target's prefill (its
        first token from the last position), then the draft's extend over the prompt with the target's
        fused features (its KV for the prompt, and the first draft token from the last position)."""
        q_len = tokens.shape[0]
        x, features = self._target(tokens, 1, q_len, cached=False)
        first = self._logits(x[-1:], self.lm_head, self.final_norm).argmax(-1)
        # The draft reads each position's token after it: the prompt shifted by one, the first token last.
        shifted = torch.cat((tokens[1:], first))
        hidden = F.linear(features, self.draft_fc)
        attn_in = torch.cat((self.embed[shifted], hidden), dim=-1)
        hidden = self._layer(self.draft_layer, hidden, attn_in, 1, q_len, None, self._rope_tables(0, q_len))
        return self._logits(hidden[-1:], self.draft_lm_head, self.draft_norm).argmax(-1)
