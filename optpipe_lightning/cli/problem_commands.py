"""``optpipe problem``: build a problem file from a model description or a stored profile."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .arguments import write_output
from .errors import UserError, describe_validation_error

if TYPE_CHECKING:  # the schedule model loads when the command runs, not for --help
    from ..schedule import Problem


def _parse_bytes(text: str | None, option: str = "--memory-limit") -> float | None:
    """'80GB', '7.5e9', '512MiB' -> bytes (per second for a bandwidth)."""
    if text is None:
        return None
    t = text.strip().replace(" ", "")
    units = {
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
        "TIB": 2**40,
        "KB": 1e3,
        "MB": 1e6,
        "GB": 1e9,
        "TB": 1e12,
        "B": 1.0,
    }
    unit = next((u for u in units if t.upper().endswith(u)), None)
    number, scale = (t[: -len(unit)], units[unit]) if unit else (t, 1.0)
    try:
        value = float(number) * scale
    except ValueError:
        raise UserError(f"{option} {text!r}: expected bytes like 40GB, 512MiB or 4e10") from None
    if not 0 < value < float("inf"):  # NaN fails too
        raise UserError(f"{option} must be a finite number of bytes > 0, got {text!r}")
    return value


def problem_command(
    layers: Annotated[int | None, typer.Option(help="transformer layers")] = None,
    hidden: Annotated[int | None, typer.Option(help="hidden size")] = None,
    heads: Annotated[int | None, typer.Option(help="attention heads")] = None,
    seq_len: Annotated[int | None, typer.Option(help="sequence length")] = None,
    microbatch_size: Annotated[int, typer.Option(help="sequences per microbatch")] = 1,
    vocab: Annotated[int | None, typer.Option(help="vocabulary size (adds the LM head)")] = None,
    dtype: Annotated[str, typer.Option(help="bf16 | fp16 | fp32")] = "bf16",
    device: Annotated[str, typer.Option(help="h100 | h200 | a100 | cpu")] = "h100",
    efficiency: Annotated[
        float | None, typer.Option(help="fraction of peak FLOP/s (default: the device's)")
    ] = None,
    stages: Annotated[int, typer.Option(help="pipeline stages (devices)")] = 8,
    microbatches: Annotated[int, typer.Option(help="microbatches per iteration")] = 24,
    chunks: Annotated[int, typer.Option(help="chunks per device")] = 1,
    placement: Annotated[str, typer.Option(help="interleaved | vshape")] = "interleaved",
    memory_limit: Annotated[
        str | None, typer.Option(help="activation bytes per stage, e.g. 40GB")
    ] = None,
    memory_limit_microbatches: Annotated[
        float | None,
        typer.Option(help="limit in microbatch activations of the heaviest stage"),
    ] = None,
    offload: Annotated[bool, typer.Option(help="allow activation offload to host")] = False,
    copy_bandwidth: Annotated[
        str | None,
        typer.Option(help="host copy bytes/s per direction, e.g. 25GB (default: the device's)"),
    ] = None,
    stages_per_copy_channel: Annotated[
        int,
        typer.Option(help="consecutive stages sharing one host copy channel (2 = GPU pairs)"),
    ] = 1,
    attention: Annotated[
        str, typer.Option(help="flash (keeps no attention scores) | eager")
    ] = "flash",
    recompute: Annotated[
        str, typer.Option(help="none | selective (attention core) | full (layer input only)")
    ] = "none",
    from_profile: Annotated[
        int | None, typer.Option(help="build from stored profile ID instead (see optpipe db list)")
    ] = None,
    db: Annotated[str | None, typer.Option(help="database URL for --from-profile")] = None,
    name: Annotated[str | None, typer.Option(help="label stored in the problem")] = None,
    out: Annotated[Path | None, typer.Option(help="write here (default: stdout)")] = None,
) -> None:
    """Build a problem from a model description (analytic estimates) or a measured profile.

    The estimates follow the Zero Bubble paper's per-layer FLOP and activation formulas, with
    FlashAttention (default) or eager attention and none, selective or full recompute; see
    docs/formats.md and optpipe_lightning/schedule/model_estimate.py for every formula and
    device constant.
    """
    from .inputs import user_errors

    with user_errors():
        limit = _parse_bytes(memory_limit)
        _check_counts(stages=stages, microbatches=microbatches, chunks=chunks)
        if from_profile is not None:
            problem = _from_profile(from_profile, db, limit, memory_limit_microbatches)
        else:
            problem = _from_model(
                layers=layers,
                hidden=hidden,
                heads=heads,
                seq_len=seq_len,
                microbatch_size=microbatch_size,
                vocab=vocab,
                dtype=dtype,
                device=device,
                efficiency=efficiency,
                num_stages=stages,
                num_microbatches=microbatches,
                num_chunks=chunks,
                placement=placement,
                memory_limit=limit,
                memory_limit_microbatches=memory_limit_microbatches,
                offload=offload,
                copy_bandwidth=_parse_bytes(copy_bandwidth, "--copy-bandwidth"),
                stages_per_copy_channel=stages_per_copy_channel,
                attention=attention,
                recompute=recompute,
                name=name,
            )
        text = problem.model_dump_json(indent=2, exclude_defaults=False)
        if out is None:
            sys.stdout.write(text + "\n")
        else:
            write_output(out, text + "\n")
            typer.echo(f"wrote {out} (problem {problem.hash})", err=True)


def _from_model(**fields: object) -> Problem:
    from pydantic import ValidationError

    from ..schedule.model_estimate import ModelSpec, estimate_problem

    missing = [
        f"--{k.replace('_', '-')}"
        for k in ("layers", "hidden", "heads", "seq_len")
        if fields[k] is None
    ]
    if missing:
        raise UserError(
            f"missing {', '.join(missing)}: describe the model, or use --from-profile ID"
        )
    try:
        spec = ModelSpec.model_validate({k: v for k, v in fields.items() if v is not None})
        return estimate_problem(spec)
    except ValidationError as e:  # the estimate out of the problem format's ranges, too
        raise UserError(describe_validation_error(e)) from None


def _from_profile(
    profile_id: int, db_url: str | None, limit: float | None, limit_mb: float | None
) -> Problem:
    from pydantic import ValidationError

    from ..profiles_db import open_database
    from ..profiles_db import repository as repo

    database = open_database(db_url, read_only=True, create=False)
    try:
        with database.session() as s:
            try:
                profile = repo.get_profile(s, profile_id)
            except LookupError:
                raise UserError(
                    f"no profile {profile_id} in {database.url}; see optpipe db list"
                ) from None
    finally:
        database.close()
    if limit_mb is not None and limit is not None:
        raise UserError("give --memory-limit or --memory-limit-microbatches, not both")
    try:
        problem = profile.to_problem(limit)
        if limit_mb is not None:
            problem = problem.with_changes(memory_limit=limit_mb * problem.activation_unit())
    except ValidationError as e:
        raise UserError(f"profile {profile_id}: {describe_validation_error(e)}") from None
    except ValueError as e:  # a profile that does not measure every (stage, chunk)
        raise UserError(f"profile {profile_id}: {e}") from None
    return problem


def _check_counts(**counts: int) -> None:
    """The format's limits on the pipeline's shape, before anything of that size is built."""
    from ..schedule.ranges import MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGES

    tops = {"stages": MAX_STAGES, "microbatches": MAX_MICROBATCHES, "chunks": MAX_CHUNKS}
    for name, value in counts.items():
        if not 1 <= value <= tops[name]:
            raise UserError(f"--{name} must be from 1 to {tops[name]}, got {value}")
