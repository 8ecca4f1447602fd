"""A Hugging Face ``transformers`` Llama (random weights, small ``LlamaConfig``) pipelined on CPU
processes equals one device (``examples/train_llama_hf.py``, ``strategy/runtime/hf.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fit_helpers import SaveFinal, assert_same_state, cpu_trainer, final_state, fork_strategy
from torch import nn

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy import ContractError

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_llama_hf as example

from optpipe_lightning.strategy import causal_lm_layers

STEPS, M = 3, 4


def fit(tmp: Path, devices: int, schedule: str, **module_kw: Any) -> dict[str, torch.Tensor]:
    strategy = fork_strategy(
        num_stages=devices, num_microbatches=M, schedule=schedule, profile_steps=1
    )
    trainer = cpu_trainer(
        devices,
        strategy,
        max_steps=STEPS,
        use_distributed_sampler=False,
        callbacks=[SaveFinal(str(tmp))],
    )
    trainer.fit(example.LlamaLM(samples=8 * STEPS, **module_kw))
    return final_state(tmp)


@pytest.mark.dist
@pytest.mark.parametrize(
    ("devices", "schedule", "attn"),
    [(2, "1f1b", "sdpa"), (2, "zbv", "eager"), (4, "interleaved-1f1b", "sdpa")],
)
def test_hf_llama_pipelined_equals_one_device(
    tmp_path: Path, devices: int, schedule: str, attn: str
) -> None:
    state = fit(tmp_path, devices, schedule, attn=attn)
    ref = example.one_device(STEPS, M, attn=attn, samples=8 * STEPS)
    assert_same_state(state, ref)


def test_layers_chain_equals_the_model_forward() -> None:
    for attn in ("sdpa", "eager"):
        module = example.LlamaLM(attn=attn)
        x, _ = next(iter(module.train_dataloader()))
        h = x
        layers = causal_lm_layers(module.model)
        assert len(layers) == 6 + 2
        for layer in layers:
            h = layer(h)
        torch.testing.assert_close(h, module(x), atol=0, rtol=0)


def test_tied_embeddings_and_other_layouts_are_one_line() -> None:
    from transformers import LlamaForCausalLM

    config = example.llama_config()
    config.tie_word_embeddings = True
    tied = LlamaForCausalLM(config)
    tied.lm_head.weight = tied.model.embed_tokens.weight
    with pytest.raises(ContractError, match="tie_word_embeddings=False"):
        causal_lm_layers(tied)
    with pytest.raises(ContractError, match="not laid out as LlamaForCausalLM"):
        causal_lm_layers(nn.Linear(2, 2))
