"""The forward-is-the-chain probe and the state it must not change (one process, no Lightning)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optpipe_lightning.strategy.runtime.chain_probe import check_forward_is_chain, probe_forward
from optpipe_lightning.strategy.runtime.contract import ContractError
from optpipe_lightning.strategy.runtime.module_state import batch_stat_layers, preserved_state


class Count(nn.Module):
    """A buffer updated in forward: the samples it saw."""

    seen: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return x


class Net(nn.Module):
    def __init__(self, variant: str = "chain") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.count = Count()
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(4, 2)
        self.variant = variant

    @property
    def layers(self) -> list[nn.Module]:
        return [self.a, self.bn, self.count, self.drop, self.b]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        h = self.a(x)
        if v == "activation":
            h = torch.relu(h)
        if v == "inplace":
            h.mul_(2.0)
        h = self.bn(h)
        if v == "kwargs":
            h = self.count(x=h)
        elif v != "skip":
            h = self.count(h)
        h = self.drop(h)
        if v == "twice":
            h = self.drop(h)
        out = self.b(h)
        return out * 2 if v == "scaled" else out


def test_a_chain_forward_passes_and_leaves_buffers_and_rng_as_they_were() -> None:
    net = Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    check_forward_is_chain(net, net.layers, (torch.randn(8, 4),))
    # torch.randn above drew from the generator; compare from the same point
    torch.manual_seed(123)
    check_forward_is_chain(net, net.layers, (torch.ones(8, 4),))
    assert torch.equal(torch.rand(3), expected_next)  # the dropout inside drew nothing for us
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # running stats, num_batches_tracked, the count
    assert net.training  # still in training mode, as it came


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        ("activation", "the input of layer 1 (BatchNorm1d) differs from what layer 0 (Linear)"),
        ("inplace", "the input of layer 1 (BatchNorm1d) differs"),
        ("skip", "forward calls layer 3 (Dropout) where the chain runs layer 2 (Count)"),
        ("kwargs", "passes keyword arguments ['x'] to layer 2 (Count)"),
        ("twice", "forward calls layer 3 (Dropout) where the chain runs layer 4 (Linear)"),
        ("scaled", "forward returns something else than layer 4 (Linear) returned"),
    ],
)
def test_a_forward_that_is_not_the_chain_is_refused_in_one_line(variant: str, says: str) -> None:
    net = Net(variant)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ContractError) as err:
        check_forward_is_chain(net, net.layers, (torch.randn(8, 4),))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("Net.forward is not the chain of configure_pipeline()'s layers: ")
    assert says in msg and "forward_is_chain=True" in msg
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_forward_that_fails_on_the_microbatch_is_one_line_naming_its_size() -> None:
    net = Net()
    with pytest.raises(
        ContractError,
        match=r"failed on the first microbatch \(1 samples\).*"
        r"Expected more than 1 value per channel.*num_microbatches",
    ):
        check_forward_is_chain(net, net.layers, (torch.randn(1, 4),))
    state = net.state_dict()
    assert int(state["bn.num_batches_tracked"]) == 0 and int(state["count.seen"]) == 0


def test_the_probe_runs_where_the_module_is_and_checks_structure_on_meta() -> None:
    with torch.device("meta"):
        net = Net("activation")
    with pytest.raises(ContractError, match="differs from what layer 0"):
        probe_forward(net, net.layers, (torch.randn(8, 4),))  # the input goes to meta too
    with torch.device("meta"):
        net = Net()
    assert probe_forward(net, net.layers, (torch.randn(8, 4),)) is None


def test_preserved_state_puts_buffers_back_without_moving_version_counters() -> None:
    bn = nn.BatchNorm1d(3)
    mean, count = bn.running_mean, bn.num_batches_tracked
    assert mean is not None and count is not None
    x = torch.randn(5, 3, requires_grad=True)
    with preserved_state([bn]):
        y = bn(x) * mean  # autograd saved the running mean for this backward
        version = mean._version
    assert mean._version == version
    y.sum().backward()  # the restore did not invalidate what autograd saved
    assert torch.equal(mean, torch.zeros(3)) and int(count) == 0
    assert batch_stat_layers([nn.Sequential(nn.Linear(3, 3), bn), nn.LayerNorm(3)]) == [
        "BatchNorm1d"
    ]


def test_a_group_with_batch_statistics_must_run_its_forwards_in_microbatch_order() -> None:
    """Running statistics depend on the order of their updates: a schedule that reorders the
    forwards of such a group is refused (one device accumulates in microbatch order)."""
    from optpipe_lightning.schedule import Problem
    from optpipe_lightning.schedule.baselines import generate
    from optpipe_lightning.strategy.runtime.engine import (
        ScheduleRejectedError,
        validate_for_execution,
    )

    one = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    gpipe = generate("gpipe", one)
    rows = [list(r) for r in gpipe.actions]
    fs = [a for a in rows[0] if a.op == "F"]
    rows[0] = [fs[1], fs[0], *(a for a in rows[0] if a.op != "F")]
    swapped = gpipe.model_copy(update={"actions": rows, "evaluation": None})
    validate_for_execution(one, swapped)  # nothing in group 0 depends on the order
    with pytest.raises(ScheduleRejectedError, match="layer group 0 holds layers with batch"):
        validate_for_execution(one, swapped, ordered_groups=[0])


def test_auto_microbatches_keep_two_samples_for_batch_statistics() -> None:
    """A batch of 8 on 4 stages: 8 one-sample microbatches, but 4 of two with BatchNorm (when no
    count leaves two, the usual one; the forward probe then names the size)."""
    from optpipe_lightning.schedule import Problem
    from optpipe_lightning.strategy.planning.options import PipelineOptions
    from optpipe_lightning.strategy.scheduling.pipeline_problem import training_microbatches

    options = PipelineOptions(schedule="1f1b")

    def shape(m: int) -> Problem:
        return Problem(num_stages=4, num_microbatches=m, t_f=1, t_b=1, t_w=1)

    assert training_microbatches(options, 4, 8, shape) == 8
    assert training_microbatches(options, 4, 8, shape, min_samples=2) == 4
    assert training_microbatches(options, 4, 32, shape, min_samples=2) == 8
    assert training_microbatches(options, 4, 4, shape, min_samples=2) == 4
