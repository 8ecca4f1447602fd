"""Measured profiles: store, find the one to reuse, read, list.

Lookup rules for reusing a profile (``find_profile``):

1. An exact fingerprint match reuses: the stored profile's ``HardwareFingerprint.key`` and
   ``ModelFingerprint.key`` equal the asked ones. The keys cover every field except the
   informative ``hostname`` (hardware) and ``name`` (model), so an identical machine of a team
   reuses a colleague's profile, and renaming a model does not lose its profile.
2. A different torch version, device kind, device count, device memory, interconnect or driver
   is a different hardware key, and a different layer structure, parameter shape, dtype,
   microbatch size, sequence length or partition a different model key: no reuse.
3. Of several profiles for one key, the newest ``measured_at`` wins (a profile without
   ``measured_at`` counts as measured when stored), so storing a newer profile refreshes it;
   the older ones stay until ``prune``. A stored profile cannot shadow a local measurement:
   one dated in the future (past ``FUTURE_SKEW_SECONDS``: another machine's clock, a hand-edited
   date) is skipped with a logged warning, and one measured on another host (its hardware
   fingerprint's ``hostname``) comes after every one measured on this host, whatever their
   dates. ``store_profile`` refuses a ``measured_at`` in the future (``db import`` too). The
   strategy re-profiles when its calibration finds a stored profile off by more than 20%.
4. With ``max_age_seconds``, a newest profile older than that is stale: ``None`` is returned
   (measure again and store the new profile, which then refreshes the key).
5. A stored profile that cannot serve the model it claims (``validation.profile_defect``: a
   (stage, chunk) it does not measure, values out of range) or whose row is damaged is skipped
   with a logged warning, and the next newest is considered.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint, Profile

from .errors import DatabaseError, NotFoundError
from .fingerprints import upsert_hardware, upsert_model
from .models import HardwareRecord, ModelRecord, ProfileRecord, utcnow
from .rows import ProfileRow
from .storage import insert_unique, parse_stored, sha256_hex
from .validation import profile_defect

__all__ = ["find_profile", "get_profile", "list_profiles", "store_profile"]

log = logging.getLogger("optpipe_lightning.profiles_db")

# a measured_at this far ahead of this machine's clock is "in the future" (clock skew beyond)
FUTURE_SKEW_SECONDS = 300.0


def _to_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _measured_at(profile: Profile) -> datetime:
    if profile.measured_at is None:
        return utcnow()
    try:
        return _to_utc(datetime.fromisoformat(profile.measured_at))
    except ValueError:
        raise ValueError(
            f"profile.measured_at {profile.measured_at!r} is not an ISO-8601 time "
            "(e.g. 2025-01-31T12:00:00+00:00)"
        ) from None


def _host_of(rec: ProfileRecord) -> str | None:
    """The hostname the profile was measured on (from its row's JSON; None if it does not
    read: the lookup then skips the row anyway)."""
    try:
        hw = json.loads(rec.data).get("hardware")
        return hw.get("hostname") if isinstance(hw, dict) else None
    except (ValueError, AttributeError):
        return None


def store_profile(s: Session, profile: Profile) -> int:
    """Store a measured profile (upserting its fingerprints); the same profile again: same id.

    A profile that cannot serve the model it claims (``validation.profile_defect``) is refused
    with ``ValueError``.
    """
    defect = profile_defect(profile)
    if defect is not None:
        raise ValueError(f"profile of model {profile.model.name!r}: {defect}")
    measured = _measured_at(profile)
    if measured > utcnow() + timedelta(seconds=FUTURE_SKEW_SECONDS):
        raise ValueError(
            f"profile of model {profile.model.name!r}: measured_at {profile.measured_at} is in "
            "the future (a wrong clock?); a future date would shadow every later measurement"
        )
    data = profile.model_dump_json()
    digest = sha256_hex(data)
    existing = s.scalars(select(ProfileRecord.id).where(ProfileRecord.digest == digest)).first()
    if existing is not None:
        return existing
    hw = upsert_hardware(s, profile.hardware)
    model = upsert_model(s, profile.model)
    rec = insert_unique(
        s,
        ProfileRecord(
            hardware_id=hw.id,
            model_id=model.id,
            digest=digest,
            num_microbatches=profile.num_microbatches,
            measured_at=measured,
            data=data,
        ),
        lambda: s.scalars(select(ProfileRecord).where(ProfileRecord.digest == digest)).first(),
    )
    return rec.id


def find_profile(
    s: Session,
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    *,
    max_age_seconds: float | None = None,
) -> Profile | None:
    """The profile to reuse for (hardware, model), by the rules in this module's docstring."""
    q = (
        select(ProfileRecord)
        .join(HardwareRecord, HardwareRecord.id == ProfileRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == ProfileRecord.model_id)
        .where(HardwareRecord.key == hardware.key, ModelRecord.key == model.key)
        .order_by(ProfileRecord.measured_at.desc(), ProfileRecord.id.desc())
    )
    now = utcnow()
    later = now + timedelta(seconds=FUTURE_SKEW_SECONDS)
    recs = list(s.scalars(q))  # newest first; this host's before other hosts'
    recs.sort(key=lambda r: _host_of(r) != hardware.hostname)
    for rec in recs:
        if _to_utc(rec.measured_at) > later:
            log.warning(
                "optpipe: skipping stored profile %d: dated %s, in the future (another "
                "machine's clock?); measure again",
                rec.id,
                _to_utc(rec.measured_at).isoformat(),
            )
            continue
        if max_age_seconds is not None:
            age = (utcnow() - rec.measured_at).total_seconds()
            if age > max_age_seconds:
                return None
        try:
            profile = parse_stored(Profile, rec.data, f"profile {rec.id}")
        except DatabaseError as e:
            log.warning("optpipe: skipping %s", e)
            continue
        defect = profile_defect(profile)
        if defect is None and (profile.model.key, profile.hardware.key) != (
            model.key,
            hardware.key,
        ):
            defect = "its JSON names another model or hardware than its row"
        if defect is None:
            return profile
        log.warning("optpipe: skipping stored profile %d: %s (measure again)", rec.id, defect)
    return None


def get_profile(s: Session, profile_id: int) -> Profile:
    rec = s.get(ProfileRecord, profile_id)
    if rec is None:
        raise NotFoundError(f"no profile with id {profile_id} in the database")
    return parse_stored(Profile, rec.data, f"profile {profile_id}")


def list_profiles(s: Session) -> list[ProfileRow]:
    q = (
        select(ProfileRecord, HardwareRecord, ModelRecord)
        .join(HardwareRecord, HardwareRecord.id == ProfileRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == ProfileRecord.model_id)
        .order_by(ProfileRecord.measured_at.desc(), ProfileRecord.id.desc())
    )
    return [
        ProfileRow(
            id=p.id,
            hardware_key=h.key,
            model_key=m.key,
            device_kind=h.device_kind,
            device_count=h.device_count,
            torch_version=h.torch_version,
            model_name=m.name,
            num_stages=m.num_stages,
            num_chunks=m.num_chunks,
            microbatch_size=m.microbatch_size,
            num_microbatches=p.num_microbatches,
            measured_at=p.measured_at,
            stored_at=p.stored_at,
        )
        for p, h, m in s.execute(q).all()
    ]
