"""A Hugging Face ``transformers`` Llama (random weights, small ``LlamaConfig``) pipelined on CPU
processes equals one device (``examples/train_llama_hf.py``, ``strategy/runtime/hf.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy import ContractError
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import train_llama_hf as example

from optpipe_lightning.strategy import causal_lm_layers

STEPS, M = 3, 4


class Saver(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(os.path.join(self.out, "final.ckpt"))


def fit(tmp: Path, devices: int, schedule: str, **module_kw: Any) -> dict[str, torch.Tensor]:
    strategy = OptPipeStrategy(
        num_stages=devices,
        num_microbatches=M,
        schedule=schedule,
        start_method="fork",
        online_resolve=False,
        use_database=False,
        profile_steps=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[Saver(str(tmp))],
    )
    trainer.fit(example.LlamaLM(samples=8 * STEPS, **module_kw))
    state: dict[str, torch.Tensor] = torch.load(tmp / "final.ckpt", weights_only=False)[
        "state_dict"
    ]
    return state


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
    assert set(state) == set(ref)
    for k, v in ref.items():
        torch.testing.assert_close(state[k], v, atol=1e-5, rtol=0, msg=k)


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
