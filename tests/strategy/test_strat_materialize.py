"""Meta-device builds: each rank materialises its own layers with one device's initial weights."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from bigmodel_lm import N_LAYERS, SEED, BigLM, one_device
from torch import nn

from optpipe_lightning.strategy.runtime.materialize import (
    MaterializeError,
    build_on_meta,
    held_bytes,
    layer_owners,
    materialise,
)


def _partition(groups: int) -> list[int]:
    base, extra = divmod(N_LAYERS, groups)
    return [base + (1 if g < extra else 0) for g in range(groups)]


@pytest.mark.parametrize(
    ("stages", "chunks", "placement"),
    [(2, 1, "interleaved"), (4, 1, "interleaved"), (2, 2, "interleaved"), (2, 2, "vshape")],
)
def test_each_rank_materialises_one_devices_weights_for_its_layers_only(
    stages: int, chunks: int, placement: str
) -> None:
    ref = one_device().state_dict()
    owners = layer_owners(N_LAYERS, _partition(stages * chunks), stages, chunks, placement)
    assert sorted(set(owners)) == list(range(stages))
    seen: set[str] = set()
    for rank in range(stages):
        pl.seed_everything(SEED, verbose=False)
        model = BigLM()
        build_on_meta(model)
        assert model.blocks is not None
        assert all(p.is_meta for p in model.parameters())
        keep = {i for i, o in enumerate(owners) if o == rank}
        materialise(model, list(model.blocks), keep, torch.device("cpu"))
        own_bytes = 0
        for i, layer in enumerate(model.blocks):
            for n, p in layer.named_parameters():
                key = f"blocks.{i}.{n}"
                if i in keep:
                    torch.testing.assert_close(p.detach(), ref[key], rtol=0, atol=0)
                    own_bytes += p.numel() * p.element_size()
                    seen.add(key)
                else:
                    assert p.is_meta, key  # dropped, not left unused
        assert held_bytes(model) == own_bytes
    assert seen == set(ref)  # every parameter materialised on exactly the ranks owning it


class NoInit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))


class Spanning(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

    def init_weights(self) -> None:
        self.a.reset_parameters()
        self.b.reset_parameters()


def test_a_tensor_nothing_initialises_is_one_clear_error() -> None:
    with torch.device("meta"):
        root = nn.Sequential(nn.Linear(2, 3), NoInit())
    with pytest.raises(MaterializeError, match=r"1 \(NoInit\) holds \['w'\].*define one"):
        materialise(root, list(root), {0, 1}, torch.device("cpu"))


def test_init_weights_over_several_layers_is_one_clear_error() -> None:
    with torch.device("meta"):
        root = nn.Sequential(Spanning())
    inner = root[0]
    assert isinstance(inner, Spanning)
    with pytest.raises(MaterializeError, match="several pipeline layers"):
        materialise(root, [inner.a, inner.b], {0}, torch.device("cpu"))


class NoInitModel(BigLM):
    def configure_model(self) -> None:
        if self.blocks is None:
            self.blocks = nn.ModuleList([nn.Linear(2, 2), NoInit()])


def test_the_launching_process_refuses_a_module_it_cannot_materialise() -> None:
    """Before any rank starts (the launcher's check): one error naming the module and the fix."""
    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

    strategy = OptPipeStrategy(num_stages=2, num_microbatches=2, start_method="fork")
    with pytest.raises(MaterializeError, match=r"blocks\.1 \(NoInit\) holds \['w'\]"):
        strategy.precheck_model(NoInitModel(), fitting=True)


@pytest.mark.parametrize("stages", [2, 4])
def test_a_rank_never_holds_more_than_its_layers_and_one_more(
    stages: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.strategy.runtime import materialize as mat

    owners = layer_owners(N_LAYERS, _partition(stages), stages, 1, "interleaved")
    real = mat.allocate
    for rank in range(stages):
        pl.seed_everything(SEED, verbose=False)
        model = BigLM()
        build_on_meta(model)
        assert model.blocks is not None
        layers = list(model.blocks)
        sizes = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in layers]
        keep = {i for i, o in enumerate(owners) if o == rank}
        peaks: list[int] = []

        def watched(
            m: nn.Module,
            device: torch.device,
            model: nn.Module = model,
            peaks: list[int] = peaks,
        ) -> None:
            real(m, device)
            peaks.append(held_bytes(model))

        monkeypatch.setattr(mat, "allocate", watched)
        materialise(model, layers, keep, torch.device("cpu"))
        monkeypatch.setattr(mat, "allocate", real)
        own = sum(sizes[i] for i in keep)
        assert max(peaks) <= own + max(sizes[i] for i in range(N_LAYERS) if i not in keep)
        assert held_bytes(model) == own


def test_init_module_builds_on_the_meta_device_only_when_asked() -> None:
    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=OptPipeStrategy(num_stages=2, num_microbatches=2, start_method="fork"),
        logger=False,
    )
    with trainer.init_module():
        real = nn.Linear(2, 2)
    with trainer.init_module(empty_init=True):
        empty = nn.Linear(2, 2)
    assert not real.weight.is_meta and empty.weight.is_meta
