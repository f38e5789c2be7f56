"""The dimensions of a Llama-architecture model, read from its Hugging Face config.json.

Standard library only, so the profile writer and the fit run where PyTorch is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a Llama-architecture model that decide its step time and memory."""

    model_path: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context_length: int
    rms_eps: float
    rope_theta: float
    eos_token_id: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LlamaShape:
        """The shape described by a Hugging Face config.json."""
        heads = int(config["num_attention_heads"])
        eos = config.get("eos_token_id", 2)
        return cls(
            model_path=str(config.get("_name_or_path", "unknown")),
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            vocab=int(config["vocab_size"]),
            context_length=int(config.get("max_position_embeddings", 4096)),
            rms_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            # Instruct checkpoints list several; the last is the end-of-turn token a chat reply stops at.
            eos_token_id=int(eos[-1] if isinstance(eos, list) else eos),
        )

    def layer_params(self, attn_in: int) -> int:
        """Parameters of one decoder layer whose attention projections read `attn_in` features."""
        qkv = attn_in * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        return qkv + out + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def target_params(self) -> int:
        """Parameters of the whole model: embedding, layers, final norm and LM head (untied)."""
        return self.layers * self.layer_params(self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    def draft_params(self, draft_vocab: int) -> int:
        """Parameters of an EAGLE-3 head: feature fusion, one layer on 2x hidden inputs, its LM head.

        The head shares the target's token embedding, so that is not counted again.
        """
        return 3 * self.hidden * self.hidden + self.layer_params(2 * self.hidden) + draft_vocab * self.hidden

    def kv_bytes_per_token(self, layers: int, dtype_bytes: int = 2) -> int:
        """KV cache bytes one token takes in `layers` layers."""
        return 2 * layers * self.kv_heads * self.head_dim * dtype_bytes
