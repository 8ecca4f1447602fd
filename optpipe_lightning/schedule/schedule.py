"""The schedule format (``optpipe.schedule/1``): per-stage ordered actions plus their evaluation.

Semantics of an action list (what the simulator times and the executor runs):

- A stage runs its compute actions (``F``, ``B``, ``W``, ``BW``) one at a time in list order, each
  as soon as its dependencies allow.
- ``OFFLOAD`` and ``RELOAD`` run on the stage's copy channel (shared by the stages of one channel
  group), one at a time. A transfer is *issued* when the compute action listed before it ends (at
  time 0 if none), so its position in the list says how early it may start: an offload listed
  right after its ``F`` starts when the ``F`` ends; a reload listed two actions before its ``B``
  overlaps the action in between.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, NamedTuple

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Strict,
    model_serializer,
    model_validator,
)

from .problem import Problem
from .ranges import MAX_CHUNKS, MAX_GENERATOR_LENGTH, MAX_MICROBATCHES, Label

SCHEDULE_FORMAT: Final = "optpipe.schedule/1"

OpKind = Literal["F", "B", "W", "BW", "OFFLOAD", "RELOAD"]
COMPUTE_KINDS = frozenset({"F", "B", "W", "BW"})
TRANSFER_KINDS = frozenset({"OFFLOAD", "RELOAD"})
ALL_KINDS = COMPUTE_KINDS | TRANSFER_KINDS


class Action(NamedTuple):
    """One op of one (stage, microbatch, chunk); the stage is the list it sits in."""

    op: str
    mb: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.op}{self.mb}" + (f".{self.chunk}" if self.chunk else "")

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_KINDS


def _parse_action(value: Any) -> Action:
    if isinstance(value, Action):
        return value
    if isinstance(value, dict):
        extra = set(value) - {"op", "mb", "chunk"}
        if extra:
            raise ValueError(f"unknown action field(s) {sorted(extra)}; allowed: op, mb, chunk")
        if "op" not in value or "mb" not in value:
            raise ValueError("an action needs 'op' and 'mb'")
        op, mb, chunk = value["op"], value["mb"], value.get("chunk", 0)
    elif isinstance(value, list | tuple) and len(value) in (2, 3):
        op, mb, chunk = value[0], value[1], value[2] if len(value) == 3 else 0
    else:
        raise ValueError("an action is {'op': ..., 'mb': ..., 'chunk': ...}")
    if not isinstance(op, str) or op not in ALL_KINDS:
        shown = repr(op) if len(repr(op)) <= 40 else repr(op)[:37] + "..."
        raise ValueError(f"unknown op {shown}; one of {', '.join(sorted(ALL_KINDS))}")
    for name, x, top in (("mb", mb, MAX_MICROBATCHES), ("chunk", chunk, MAX_CHUNKS)):
        if type(x) is not int or not 0 <= x < top:
            shown = repr(x) if len(repr(x)) <= 40 else repr(x)[:37] + "..."
            raise ValueError(f"action {name} must be an integer from 0 to {top - 1}, got {shown}")
    return Action(op, mb, chunk)


def _dump_action(a: Action) -> dict[str, Any]:
    return {"op": a.op, "mb": a.mb, "chunk": a.chunk}


ActionField = Annotated[
    Action, BeforeValidator(_parse_action), PlainSerializer(_dump_action, return_type=dict)
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Violation(_Strict):
    """One reason a schedule cannot run as given."""

    kind: Literal[
        "missing-op",
        "duplicate-op",
        "unknown-op",
        "deadlock",
        "memory",
        "reload-after-use",
        "offload-not-there",
        "offload-unpaired",
        "offload-not-allowed",
    ]
    message: str
    stage: int | None = None
    time: float | None = None


class Evaluation(_Strict):
    """What the simulator says of a schedule on its problem."""

    feasible: bool
    makespan: float | None = Field(description="seconds; None when the schedule cannot be timed")
    bubble_rate: float | None = None
    stage_span_bubble_rate: float | None = None
    peak_memory: list[float] = Field(default_factory=list)
    memory_limit: list[float | None] = Field(default_factory=list)
    num_offloaded: int = 0
    violations: list[Violation] = Field(default_factory=list)


class Schedule(_Strict):
    """A schedule for one problem (by hash): who runs what, in which order."""

    format: Literal["optpipe.schedule/1"] = SCHEDULE_FORMAT
    problem_hash: Annotated[str, Strict(), Field(max_length=64)]
    generator: Annotated[Label, Field(max_length=MAX_GENERATOR_LENGTH)]
    params: dict[str, Any] = Field(default_factory=dict)
    actions: list[list[ActionField]]
    evaluation: Evaluation | None = None
    problem: Problem | None = Field(
        default=None, description="the problem itself, so the file is self-contained (optional)"
    )
    num_chunks: int | None = Field(
        default=None,
        ge=1,
        description="chunks per device of the problem it was built for (solve and compare "
        "record it: with layers_per_stage that may be a re-chunking of the problem given)",
    )
    placement: Literal["interleaved", "vshape"] | None = Field(
        default=None, description="the placement of those chunks (recorded with num_chunks)"
    )
    memory_budget: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        default=None,
        description="bytes per stage the schedule's memory waits were planned for (a schedule "
        "solved with a memory margin: the limit less the margin); the simulator and executor "
        "keep each stage within the lower of it and the problem's limit. Absent: the limit "
        "(and omitted from the JSON, so schedules without it keep their bytes)",
    )

    @model_validator(mode="after")
    def _budget_per_stage(self) -> Schedule:
        if self.memory_budget is not None and len(self.memory_budget) != len(self.actions):
            raise ValueError(
                f"memory_budget has {len(self.memory_budget)} entries, expected one per stage "
                f"({len(self.actions)})"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_budget(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("memory_budget", 0) is None:
            del data["memory_budget"]
        return data

    @property
    def num_stages(self) -> int:
        return len(self.actions)

    def num_offloaded(self) -> int:
        return sum(1 for row in self.actions for a in row if a.op == "OFFLOAD")

    @classmethod
    def built(
        cls,
        *,
        problem_hash: str,
        generator: str,
        actions: list[list[Action]],
        params: dict[str, Any] | None = None,
        evaluation: Evaluation | None = None,
        problem: Problem | None = None,
    ) -> Schedule:
        """A schedule from action lists a generator built, without re-parsing every action.

        The same schedule the constructor gives when every action is already an ``Action``
        (checked: anything else goes through the constructor): the constructor parses each
        action again, 0.1 s at 100k actions, which the solver's first answer cannot spare.
        """
        fields: dict[str, Any] = {
            "problem_hash": problem_hash,
            "generator": generator,
            "params": {} if params is None else params,
            "actions": actions,
            "evaluation": evaluation,
            "problem": problem,
        }
        ok = (
            isinstance(actions, list)
            and all(isinstance(row, list) for row in actions)
            and all(type(a) is Action for row in actions for a in row)
            and (evaluation is None or isinstance(evaluation, Evaluation))
            and (problem is None or isinstance(problem, Problem))
        )
        if not ok:
            return cls(**fields)
        return cls.model_construct(**fields)

    def with_evaluation(self, evaluation: Evaluation) -> Schedule:
        return self.model_copy(update={"evaluation": evaluation})

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Schedule:
        return cls.model_validate_json(text)
