"""Reading an export back: every row checked as a freshly tuned winner is (check_import), all or
nothing in one transaction, duplicates stored once, the measurement time kept."""

from __future__ import annotations

import json

import pytest

from cutetune.device.specs import device_spec_for
from cutetune.results_db import export_winners, winners_with_devices
from cutetune.results_db.export import Refusal, check_import, import_winners
from cutetune.results_db.schema import TrialRow, TuningRunRow, WinnerRow
from testkit.bad_imports import BAD_ROWS, MEASURED_AT, export_text, spoiled, valid_records


def row_counts(db) -> tuple[int, int, int]:
    with db.session() as session:
        return tuple(session.query(table).count() for table in (TuningRunRow, TrialRow,
                                                                 WinnerRow))


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("bad", BAD_ROWS, ids=lambda bad: bad.name)
def test_every_invalid_row_is_refused_by_field_and_reason(bad, fmt):
    if fmt == "csv" and bad.name == "missing-column":
        pytest.skip("a CSV row cannot lack a column its header has: the header is checked")
    checked = check_import(export_text(spoiled(bad), fmt), fmt, device_spec_for)
    (refusal,) = checked.refused
    assert (refusal.row, refusal.field) == (2, bad.column(fmt)), refusal
    assert bad.reason in refusal.reason
    assert str(refusal).startswith(f"row 2: {bad.column(fmt)}: ")
    assert (checked.rows, len(checked.runs), checked.duplicates) == (3, 2, 0)


def test_a_file_with_an_invalid_row_writes_nothing(db):
    text = export_text(valid_records(), "json")
    import_winners(db, text, "json", device_spec_for)
    before = row_counts(db)
    with pytest.raises(ValueError, match=r"1 of 3 rows refused, the first row 2: bucket: 3 is "
                                         r"not a power of two.*; nothing imported"):
        import_winners(db, export_text(spoiled(BAD_ROWS[2]), "json"), "json", device_spec_for)
    assert row_counts(db) == before


def test_skip_invalid_stores_the_valid_rows_and_names_the_others(db):
    records = [*valid_records(), *(spoiled(bad)[1] for bad in BAD_ROWS[:3])]
    checked = import_winners(db, export_text(records, "json"), "json", device_spec_for,
                             skip_invalid=True)
    assert [r.row for r in checked.refused] == [3, 4, 5]
    assert sorted(w.bucket for _, w in winners_with_devices(db)) == [8, 4096]
    assert row_counts(db) == (2, 2, 2)


def test_the_import_is_one_transaction(db, monkeypatch):
    """A failure while writing the second winner leaves nothing of the first either."""
    from cutetune.results_db import queries

    upsert, calls = queries._upsert_winner, []

    def failing_second(session, run, trial):
        calls.append(run)
        if len(calls) == 2:
            raise RuntimeError("the server went away")
        upsert(session, run, trial)

    monkeypatch.setattr(queries, "_upsert_winner", failing_second)
    with pytest.raises(RuntimeError, match="went away"):
        import_winners(db, export_text(valid_records(), "json"), "json", device_spec_for)
    assert row_counts(db) == (0, 0, 0)


def test_duplicates_are_stored_and_counted_once_the_faster_kept(db):
    first, second = valid_records()
    slower = {**first, "median_us": first["median_us"] * 2,
              "config": {**first["config"], "warps_per_block": 4}}
    records = [first, second, dict(first), slower, dict(second)]
    checked = import_winners(db, export_text(records, "json"), "json", device_spec_for)
    assert (checked.rows, len(checked.runs), checked.duplicates, checked.refused) == (5, 2, 3, ())
    assert row_counts(db) == (2, 2, 2)
    stored = {w.bucket: json.loads(w.config_json) for _, w in winners_with_devices(db)}
    assert stored[first["bucket"]] == first["config"]


def test_a_later_measurement_of_the_same_config_is_the_one_kept():
    first, _ = valid_records()
    later = {**first, "median_us": first["median_us"] * 3,
             "updated_at": MEASURED_AT.replace(hour=11).isoformat()}
    for records in ([first, later], [later, first]):
        checked = check_import(export_text(records, "json"), "json", device_spec_for)
        ((_, run),) = checked.runs
        assert run.finished_at == MEASURED_AT.replace(hour=11)


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_export_then_import_keeps_every_winner_with_its_measurement_time(db, fmt, tmp_path):
    from cutetune.results_db import Database

    import_winners(db, export_text(valid_records(), "json"), "json", device_spec_for)
    exported = winners_with_devices(db)
    assert [w.updated_at for _, w in exported] == [MEASURED_AT, MEASURED_AT.replace(minute=1)]
    target = Database.open(f"sqlite:///{tmp_path / 'target.db'}")
    import_winners(target, export_winners(db, fmt), fmt, device_spec_for)
    assert winners_with_devices(target) == exported
    # Imported again, nothing moves: the same measurements of the same points.
    import_winners(target, export_winners(db, fmt), fmt, device_spec_for)
    assert winners_with_devices(target) == exported


def test_an_older_measurement_of_the_stored_config_does_not_replace_it(db):
    """The same config measured again replaces the stored one whichever way it moved, but an
    import of an older measurement of it does not, faster or not."""
    first, _ = valid_records()
    newer = {**first, "updated_at": MEASURED_AT.replace(hour=12).isoformat()}
    older = {**first, "median_us": first["median_us"] / 2}
    import_winners(db, export_text([newer], "json"), "json", device_spec_for)
    import_winners(db, export_text([older], "json"), "json", device_spec_for)
    ((_, stored),) = winners_with_devices(db)
    assert (stored.median_us, stored.updated_at) == (first["median_us"],
                                                     MEASURED_AT.replace(hour=12))


def test_rows_are_stored_with_the_canonical_problem_and_config(db):
    """A hand-written row (keys in another order, 0 for 0.0) is stored as tuning writes the
    same point, so the dispatcher finds it."""
    (first, _) = valid_records()
    static = {**json.loads(first["static_key"]), "weight_bias": 0}
    hand_written = {**first, "static_key": json.dumps(dict(reversed(static.items()))),
                    "config": dict(reversed(first["config"].items()))}
    import_winners(db, export_text([hand_written], "json"), "json", device_spec_for)
    ((_, stored),) = winners_with_devices(db)
    assert stored.static_key == first["static_key"]
    assert stored.config_json == json.dumps(first["config"], sort_keys=True)


def test_text_that_is_no_export_is_one_error():
    with pytest.raises(ValueError, match="not a JSON export"):
        check_import("[{", "json", device_spec_for)
    with pytest.raises(ValueError, match="not a JSON export: expected a list"):
        check_import('{"kernel_name": "qk_norm"}', "json", device_spec_for)
    with pytest.raises(ValueError, match="not a CSV export: missing the columns median_us"):
        header = export_text(valid_records(), "csv").replace(",median_us", ",median")
        check_import(header, "csv", device_spec_for)


def test_a_refusal_reads_as_row_field_and_reason():
    assert str(Refusal(3, "bucket", "3 is not a power of two")) == (
        "row 3: bucket: 3 is not a power of two")
