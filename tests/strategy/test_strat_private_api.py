"""Every private Lightning/torch name optpipe uses is still there, with the parameters we pass.

A Lightning or torch release that moves, renames or re-signs one fails here with one line naming
it (docs/strategy.md, "Private APIs", lists them with the versions tested).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.distributed.pipelining import schedules

from optpipe_lightning.strategy.lightning import private_api
from optpipe_lightning.strategy.runtime import torch_adapter


def test_every_private_lightning_name_is_there_with_our_parameters() -> None:
    assert private_api.check() == []


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
def test_the_check_names_a_changed_private_lightning_api(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    mod = importlib.import_module(
        "optpipe_lightning.strategy."
        + ("lightning" if namespace == "lightning.pytorch" else "pytorch_lightning")
        + ".private_api"
    )
    fabric = importlib.import_module(
        "lightning.fabric" if namespace == "lightning.pytorch" else "lightning_fabric"
    ).utilities.distributed
    monkeypatch.delattr(fabric, "_init_dist_connection")
    launchers = importlib.import_module(f"{namespace}.strategies.launchers")

    class Resigned:
        def __init__(self, strategy: object) -> None:  # start_method gone
            pass

    monkeypatch.setattr(launchers, "_MultiProcessingLauncher", Resigned)
    problems = mod.check()
    assert len(problems) == 2
    assert "_init_dist_connection is gone" in problems[1]
    assert "_MultiProcessingLauncher no longer takes start_method" in problems[0]
    assert all(p.startswith("optpipe: Lightning ") and "tested with 2.4.0" in p for p in problems)


def test_torch_pipelining_privates_are_there() -> None:
    for name in ("_PipelineScheduleRuntime", "_Action", "_ComputationType", "_add_send_recv"):
        assert hasattr(schedules, name), f"torch {torch.__version__} lacks schedules.{name}"
    runtime = schedules._PipelineScheduleRuntime
    assert hasattr(runtime, "_prepare_schedule_with_comms")
    # the adapter passes the action table positionally, nothing else
    params = list(inspect.signature(runtime._prepare_schedule_with_comms).parameters.values())[1:]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    assert len(required) == 1, f"_prepare_schedule_with_comms now needs {required}"
    assert torch_adapter._probe()["sch"] is schedules


def test_the_torch_probe_names_a_missing_private(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(schedules, "_add_send_recv")
    with pytest.raises(
        torch_adapter.UnsupportedTorchError,
        match=r"lacks pipelining internals \['_add_send_recv'\]; install torch >= 2\.\d+, < 2\.16",
    ):
        torch_adapter._probe()


def test_runtime_actions_are_annotated_only_while_a_profiler_records() -> None:
    """torch's runtime wraps each action in ``record_function`` (~9 us with no profiler
    running); our steps keep the annotation while a torch profiler records and skip it
    otherwise (issue 34.3); torch's own name is back after every step."""
    real = schedules.record_function
    seen: list[bool] = []

    class Runtime:  # calls the name as torch's runtime does, once per action
        def step(self, *args: object, **kwargs: object) -> None:
            for _ in range(3):
                with schedules.record_function("PP:0F0") as ctx:
                    seen.append(isinstance(ctx, torch.autograd.profiler.record_function))

    torch_adapter.run_step(Runtime(), None, 2)
    assert seen == [False] * 3 and schedules.record_function is real
    with torch.profiler.profile() as prof:
        torch_adapter.run_step(Runtime(), None, 2)
    assert seen[3:] == [True] * 3 and schedules.record_function is real
    assert sum(e.name == "PP:0F0" for e in prof.events()) == 3

    class Failing:
        def step(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        torch_adapter.run_step(Failing(), None, 2)
    assert schedules.record_function is real
