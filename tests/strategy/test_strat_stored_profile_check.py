"""A stored profile far off the measured steps is replaced (issue 33.3): the first calibration
on it sees the steps take far longer than it predicts, and the run profiles again, stores the
new profile and adopts a schedule on it; the numbers do not change."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_strat_lightning import check_final, fit, reference

from optpipe_lightning.schedule.profile import Profile
from optpipe_lightning.strategy.scheduling.calibration import stored_profile_error


def test_stored_profile_error_is_relative_to_the_prediction() -> None:
    assert stored_profile_error({"measured_seconds": 1.0, "previous_seconds": 1.1}) is None
    assert stored_profile_error({"measured_seconds": 1.25, "previous_seconds": 1.0}) == 0.25
    assert stored_profile_error({"measured_seconds": 0.5, "previous_seconds": 1.0}) == -0.5
    assert stored_profile_error({"measured_seconds": 1.0, "previous_seconds": None}) is None


def _hundred_times_faster(profile: Profile) -> Profile:
    stages = [
        st.model_copy(
            update={
                k: None
                if getattr(st, k) is None
                else getattr(st, k).model_copy(update={"mean": getattr(st, k).mean / 100})
                for k in ("f", "b", "w", "bw")
                if hasattr(st, k)
            }
        )
        for st in profile.stages
    ]
    return profile.model_copy(
        update={
            "stages": stages,
            "runtime_overhead": profile.runtime_overhead / 100,
            "measured_at": datetime.now(UTC).isoformat(),
        }
    )


@pytest.mark.dist
def test_a_stored_profile_far_off_the_steps_is_measured_again(tmp_path: Path) -> None:
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    fit(tmp_path / "a", 3, schedule="1f1b", profile_steps=1, use_database=True, database=url)
    db = open_database(url)
    with db.session() as s:
        (row,) = repo.list_profiles(s)
        wrong = _hundred_times_faster(repo.get_profile(s, row.id))
        repo.store_profile(s, wrong)  # the newest: what the next run starts from
    db.close()

    ref_losses, ref_state = reference(9)
    ranks = fit(
        tmp_path / "b",
        9,
        schedule="1f1b",
        profile_steps=1,
        use_database=True,
        database=url,
        calibrate_every=1,
        calibrate_min_steps=2,
        calibrate_budget=None,
    )
    for r in ranks:  # profiling again changes no numbers
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
    check_final(tmp_path / "b", ref_state)
    reasons = [s["reason"] for s in ranks[0]["switches"]]
    assert reasons[0] == "stored profile"
    assert reasons[1].startswith("stored profile off by +")  # far slower than predicted
    assert reasons[2] == "profiled"
    assert ranks[0]["switches"] == ranks[1]["switches"]
    db = open_database(url)
    with db.session() as s:
        profiles = repo.list_profiles(s)
        newest = repo.find_profile(s, wrong.hardware, wrong.model)
    db.close()
    assert len(profiles) == 3  # the first run's, the wrong one, and the one measured again
    assert newest is not None and newest != wrong  # what later runs start from
