"""The sharded checkpoint format in one process: names, optimizer indices, errors, the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from optpipe_lightning.strategy.runtime.sharded_checkpoint import (
    ShardedCheckpointError,
    consolidate,
    load_sharded,
    local_optimizer_state,
    main,
    save_sharded,
)


def _trained() -> tuple[nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    groups: list[dict[str, Any]] = [
        {"params": list(model[0].parameters()), "lr": 0.1},
        {"params": list(model[2].parameters())},
    ]
    opt = torch.optim.Adam(groups, lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    return model, opt


def _save(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> None:
    path.mkdir()
    ckpt = {
        "state_dict": model.state_dict(),
        "optimizer_states": [local_optimizer_state(opt, model)],
        "global_step": 2,
    }
    save_sharded(ckpt, path, is_global_zero=True)


def test_consolidate_gives_the_optimizer_state_torch_saves(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(model, opt, tmp_path / "c.ckpt")
    whole = consolidate(tmp_path / "c.ckpt")
    assert whole["global_step"] == 2
    for k, v in model.state_dict().items():
        torch.testing.assert_close(whole["state_dict"][k], v, rtol=0, atol=0)
    want = opt.state_dict()
    got = whole["optimizer_states"][0]
    assert got["param_groups"] == want["param_groups"]
    assert set(got["state"]) == set(want["state"])
    for i, st in want["state"].items():
        for key, v in st.items():
            torch.testing.assert_close(got["state"][i][key], v, rtol=0, atol=0)
    # it loads into a fresh model and optimizer as an ordinary checkpoint does
    fresh, fresh_opt = _trained()
    fresh.load_state_dict(whole["state_dict"])
    fresh_opt.load_state_dict(got)


def test_load_by_name_into_another_model_and_its_errors(tmp_path: Path) -> None:
    model, opt = _trained()
    _save(model, opt, tmp_path / "c.ckpt")
    torch.manual_seed(1)
    other = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    other_opt = torch.optim.Adam(other.parameters(), lr=0.5)
    meta = load_sharded(tmp_path / "c.ckpt", other, [other_opt], torch.device("cpu"))
    assert meta["global_step"] == 2
    for k, v in model.state_dict().items():
        torch.testing.assert_close(other.state_dict()[k], v, rtol=0, atol=0)
    assert other_opt.param_groups[0]["lr"] == 0.1  # the saved hyperparameters
    head, trained_head = other[2], model[2]
    assert isinstance(head, nn.Linear) and isinstance(trained_head, nn.Linear)
    torch.testing.assert_close(
        other_opt.state[head.weight]["exp_avg"], opt.state[trained_head.weight]["exp_avg"]
    )
    bigger = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2), nn.Linear(2, 2))
    with pytest.raises(ShardedCheckpointError, match=r"has no \['3.weight', '3.bias'\]"):
        load_sharded(tmp_path / "c.ckpt", bigger, [], torch.device("cpu"))


def test_the_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, opt = _trained()
    _save(model, opt, tmp_path / "c.ckpt")
    assert main([str(tmp_path / "c.ckpt"), str(tmp_path / "one.ckpt")]) == 0
    whole = torch.load(tmp_path / "one.ckpt", weights_only=False)
    assert set(whole["state_dict"]) == set(model.state_dict())
    assert main([str(tmp_path), str(tmp_path / "x.ckpt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a sharded optpipe checkpoint" in err
    # a mistake in the output path: one line each, nothing written
    for out, says in [(tmp_path / "no" / "x.ckpt", "does not exist"), (tmp_path, "is a directory")]:
        assert main([str(tmp_path / "c.ckpt"), str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert main([]) == 2
