"""Pipeline a Hugging Face ``transformers`` Llama with ``OptPipeStrategy`` (random weights from
a small ``LlamaConfig``: nothing is downloaded).

Needs the ``hf`` extra: ``pip install -c constraints.txt -e ".[train,hf]"``.

CPU, 2 processes (gloo), about a minute::

    python examples/train_llama_hf.py --devices 2 --steps 20

CPU, 4 processes, ZB-V (2 chunks per device; 6 decoder layers + embedding + head)::

    python examples/train_llama_hf.py --devices 4 --schedule zbv --steps 20

``--check`` trains the same model on one device afterwards (each batch in the same microbatches,
their gradients accumulated) and prints the largest parameter difference.

The module is written as for one device: ``forward`` is the Hugging Face model's own forward,
``training_step`` calls ``self(input_ids)``. The one pipeline hook lists the layers with
``optpipe_lightning.strategy.causal_lm_layers``, which gives each decoder layer what the
Llama model otherwise computes once for all of them (rotary position embeddings, position ids,
the causal mask).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from optpipe_lightning.strategy import PipelineSpec, causal_lm_layers
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

VOCAB, SEQ = 128, 16


def llama_config(layers: int = 6, hidden: int = 32, attn: str = "sdpa") -> Any:
    from transformers import LlamaConfig

    options: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4 * SEQ,
        "tie_word_embeddings": False,  # the embedding and the head sit on different stages
        "attn_implementation": attn,
    }
    return LlamaConfig(**options)


def token_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(VOCAB, (n, SEQ + 1), generator=g)
    return TensorDataset(x[:, :-1], x[:, 1:])


class LlamaLM(pl.LightningModule):
    def __init__(
        self, layers: int = 6, hidden: int = 32, attn: str = "sdpa", samples: int = 64
    ) -> None:
        super().__init__()
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)  # every rank (and one device) builds the same weights
        self.model = LlamaForCausalLM(llama_config(layers, hidden, attn))
        self.samples = samples

    def configure_pipeline(self) -> PipelineSpec:
        # the wrappers compute the model's forward (tested equal); the model's own forward does
        # not call them, so the chain probe is told
        return PipelineSpec(layers=causal_lm_layers(self.model), forward_is_chain=True)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(token_data(self.samples, 0), batch_size=8, drop_last=True)


def one_device(steps: int, microbatches: int, **kw: Any) -> dict[str, torch.Tensor]:
    """The same training on one device: each batch in ``microbatches`` parts, gradients
    accumulated (loss / M per part), the batches in order."""
    module = LlamaLM(**kw)
    opt = module.configure_optimizers()
    batches = iter(module.train_dataloader())
    for _ in range(steps):
        x, y = next(batches)
        opt.zero_grad()
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            loss = F.cross_entropy(module(xm).flatten(0, 1), ym.flatten()) / microbatches
            loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="compare with one device afterwards")
    args = ap.parse_args()
    module = LlamaLM(layers=args.layers, samples=8 * args.steps)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=OptPipeStrategy(
            schedule=args.schedule,
            num_microbatches=args.microbatches,
            use_database=False,
            online_resolve=False,
        ),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,  # the batches in order, as one device takes them
    )
    trainer.fit(module)  # afterwards `module` holds the whole trained model
    if args.check and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        ref = one_device(args.steps, args.microbatches, layers=args.layers, samples=8 * args.steps)
        diff = max(float((module.state_dict()[k] - v).abs().max()) for k, v in ref.items())
        print(f"largest parameter difference to one device: {diff:.3g}")


if __name__ == "__main__":
    main()
