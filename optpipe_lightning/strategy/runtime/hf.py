"""Hugging Face causal language models as pipeline layers (``pip install optpipe-lightning[hf]``).

A ``transformers`` decoder layer does not take only the hidden states: its model computes the
rotary position embeddings (``rotary_emb(hidden, position_ids)``), the position ids and the
causal mask once and hands them to every layer. Between pipeline stages only the hidden states
travel, so ``causal_lm_layers`` wraps each decoder layer with what it needs, recomputed on its
own stage from the hidden states' sequence length (a few small tensors per layer):

- ``HFEmbedding``: ``input_ids -> embed_tokens(input_ids)``;
- ``HFDecoderLayer``: the decoder layer with position ids ``0..S-1``, its own copy of the model's
  rotary embedding (buffers only, no parameters) and the causal mask the model would build
  (``None`` for ``sdpa``, whose kernel is causal by itself then, as in the model's own forward;
  an additive ``[1, 1, S, S]`` mask for ``eager``);
- ``HFHead``: the final norm and ``lm_head``: the logits.

Use::

    from transformers import LlamaConfig, LlamaForCausalLM
    from optpipe_lightning.strategy import causal_lm_layers

    class Module(pl.LightningModule):
        def __init__(self, config: LlamaConfig) -> None:
            super().__init__()
            self.model = LlamaForCausalLM(config)

        def configure_pipeline(self) -> PipelineSpec:
            return PipelineSpec(layers=causal_lm_layers(self.model), forward_is_chain=True)

        def forward(self, input_ids):
            return self.model(input_ids).logits  # one device; the pipeline computes the same

Supported: decoder-only models laid out as Llama is (``model.model.embed_tokens``,
``.layers``, ``.norm``, ``.rotary_emb``, ``model.lm_head``: Llama, Mistral, Qwen2 and others),
full causal attention without padding masks or a KV cache (training), untied embeddings
(``tie_word_embeddings=False``: the embedding and the head would sit on different stages).
This module imports ``transformers`` only when its functions run.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .contract import ContractError


class HFEmbedding(nn.Module):
    """``input_ids`` ``[B, S]`` -> hidden states ``[B, S, H]``."""

    def __init__(self, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed_tokens(input_ids)
        return out


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive ``[1, 1, S, S]`` causal mask: 0 on and below the diagonal, the dtype's
    minimum above it (what ``transformers`` builds for eager attention without padding)."""
    full = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device)
    return full.triu(1)[None, None]


class HFDecoderLayer(nn.Module):
    """A ``transformers`` decoder layer taking the hidden states alone."""

    def __init__(self, layer: nn.Module, rotary_emb: nn.Module, attn_implementation: str) -> None:
        super().__init__()
        self.layer = layer
        self.rotary_emb = rotary_emb
        self.attn_implementation = attn_implementation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        length = hidden.shape[1]
        position_ids = torch.arange(length, device=hidden.device).unsqueeze(0)
        position_embeddings = self.rotary_emb(hidden, position_ids)
        mask = None
        if self.attn_implementation == "eager":
            mask = causal_mask(length, hidden.dtype, hidden.device)
        out = self.layer(
            hidden,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            use_cache=False,
        )
        # transformers 5 returns the hidden states, 4.x a tuple starting with them
        result: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return result


class HFHead(nn.Module):
    """Hidden states -> logits: the model's final norm, then ``lm_head``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.norm(hidden))
        return out


def causal_lm_layers(model: nn.Module) -> list[nn.Module]:
    """The pipeline layers of a ``transformers`` causal LM: embedding, each decoder layer,
    head (norm + ``lm_head``). The layers share the model's parameters (nothing is copied but
    the rotary embedding's buffers); ``ContractError`` with one line for a model laid out
    otherwise, or with tied embeddings."""
    name = type(model).__name__
    base = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    missing = [p for p in parts if base is None or not hasattr(base, p)]
    if missing or not hasattr(model, "lm_head"):
        raise ContractError(
            f"causal_lm_layers: {name} is not laid out as LlamaForCausalLM (missing "
            f"{', '.join(['model.' + p for p in missing] + ([] if hasattr(model, 'lm_head') else ['lm_head']))}); "
            "list its layers in configure_pipeline yourself"
        )
    assert base is not None
    head = model.get_submodule("lm_head")
    config: Any = getattr(model, "config", None)
    tied = getattr(head, "weight", None) is getattr(base.embed_tokens, "weight", 0)
    if getattr(config, "tie_word_embeddings", False) or tied:
        raise ContractError(
            f"causal_lm_layers: {name} ties its input embedding and lm_head "
            "(tie_word_embeddings=True); they would sit on different pipeline stages: build the "
            "model with tie_word_embeddings=False"
        )
    attn = str(getattr(config, "_attn_implementation", None) or "eager")
    if attn not in ("eager", "sdpa"):
        raise ContractError(
            f"causal_lm_layers: attention implementation {attn!r} is not supported; "
            "use attn_implementation='sdpa' or 'eager'"
        )
    decoders = [
        HFDecoderLayer(layer, copy.deepcopy(base.rotary_emb), attn) for layer in base.layers
    ]
    return [HFEmbedding(base.embed_tokens), *decoders, HFHead(base.norm, head)]
