"""Whole results moved between databases (issue 41, item 5): `cutetune export --format db` of a
team's database (SQLite or PostgreSQL) and `cutetune import` of that file into an engine
host's SQLite file copy every winner with the run that named it, every trial of that run and
the devices' ceilings, fingerprints and source hashes kept; a second import skips what is held
and says how many."""

from __future__ import annotations

import dataclasses

from click.testing import CliRunner
from sqlalchemy import func, select

from cutetune.cli.main import cli
from cutetune.results_db import Database, copy_results, winners_with_devices
from cutetune.results_db.schema import CeilingRow, TrialRow, TuningRunRow
from testkit.h200_results import H200_URL


def contents(db: Database) -> tuple:
    """The winners with their devices, and each winner's run's trials, and the ceilings. A
    winner's time is left out: a copied winner's is its run's end, as any recorded run's is
    (queries.record_tuning_result), which the H200 file's older rows stored a few ms apart."""
    with db.session() as session:
        trials = sorted(session.execute(
            select(TuningRunRow.bucket, TuningRunRow.study_name, TrialRow.number,
                   TrialRow.config_json, TrialRow.status, TrialRow.median_us)
            .join(TrialRow, TrialRow.run_id == TuningRunRow.id)).all())
        ceilings = sorted(session.execute(
            select(CeilingRow.name, CeilingRow.value, CeilingRow.measured_at)).all())
    return ([(device, dataclasses.replace(winner, updated_at=None))
             for device, winner in winners_with_devices(db)], trials, ceilings)


def test_a_team_database_moves_to_an_engine_hosts_file_whole(database_url, tmp_path):
    h200 = Database.open(H200_URL, read_only=True)
    team = Database.open(database_url)
    copied = copy_results(h200, team)
    assert copied.runs > 0 and copied.trials > copied.runs and copied.ceilings > 0
    team.dispose()

    runner = CliRunner()
    out = tmp_path / "team.db"
    exported = runner.invoke(cli, ["--db", database_url, "export", "--format", "db",
                                   "--all-devices", "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    assert (f"exported {copied.runs} winners with their runs ({copied.trials} trials) and "
            f"{copied.ceilings} ceilings to {out}") in exported.output

    engine_url = f"sqlite:///{tmp_path / 'engine.db'}"
    imported = runner.invoke(cli, ["--db", engine_url, "import", str(out)])
    assert imported.exit_code == 0, imported.output
    assert (f"imported {copied.runs} winners with their runs ({copied.trials} trials) and "
            f"{copied.ceilings} ceilings from {out}; 0 runs and 0 ceilings held already "
            "skipped; 0 winners refused") in imported.output
    engine = Database.open(engine_url, read_only=True)
    assert contents(engine) == contents(h200)

    again = runner.invoke(cli, ["--db", engine_url, "import", str(out)])
    assert again.exit_code == 0, again.output
    assert (f"imported 0 winners with their runs (0 trials) and 0 ceilings from {out}; "
            f"{copied.runs} runs and {copied.ceilings} ceilings held already skipped"
            ) in again.output
    with engine.session() as session:
        assert session.scalar(select(func.count()).select_from(TuningRunRow)) == copied.runs
    h200.dispose()
    engine.dispose()


def test_export_as_a_database_needs_a_file_and_import_refuses_one_that_is_none(tmp_path):
    runner = CliRunner()
    no_out = runner.invoke(cli, ["--db", H200_URL, "export", "--format", "db"])
    assert no_out.exit_code == 2 and "give --out FILE" in no_out.output
    bogus = tmp_path / "notes.db"
    bogus.write_text("not a database")
    target = tmp_path / "engine.db"
    refused = runner.invoke(cli, ["--db", f"sqlite:///{target}", "import", str(bogus)])
    assert refused.exit_code == 2 and f"cannot read {bogus}" in refused.output
    assert "Traceback" not in refused.output
    assert not target.exists()
