"""The hardware and model fingerprints that profiles and training runs are stored under.

One row per fingerprint key (``HardwareFingerprint.key``, ``ModelFingerprint.key``); the
informative fields the keys leave out (hostname, model name) keep the latest value seen.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint

from .models import HardwareRecord, ModelRecord
from .storage import insert_unique


def upsert_hardware(s: Session, hw: HardwareFingerprint) -> HardwareRecord:
    key = hw.key
    rec = insert_unique(
        s,
        HardwareRecord(
            key=key,
            device_kind=hw.device_kind,
            device_count=hw.device_count,
            device_memory=hw.device_memory,
            interconnect=hw.interconnect,
            driver=hw.driver,
            torch_version=hw.torch_version,
            data=hw.model_dump_json(),
        ),
        lambda: s.scalars(select(HardwareRecord).where(HardwareRecord.key == key)).first(),
    )
    data = hw.model_dump_json()
    if rec.data != data:  # informative fields (hostname): keep the latest seen
        rec.data = data
    return rec


def upsert_model(s: Session, model: ModelFingerprint) -> ModelRecord:
    key = model.key
    rec = insert_unique(
        s,
        ModelRecord(
            key=key,
            name=model.name,
            dtype=model.dtype,
            num_layers=len(model.layer_structure),
            microbatch_size=model.microbatch_size,
            sequence_length=model.sequence_length,
            num_stages=model.num_stages,
            num_chunks=model.num_chunks,
            data=model.model_dump_json(),
        ),
        lambda: s.scalars(select(ModelRecord).where(ModelRecord.key == key)).first(),
    )
    if rec.name != model.name:  # informative: keep the latest name
        rec.name = model.name
        rec.data = model.model_dump_json()
    return rec
