"""The winners shipped inside the package: exports (`cutetune export --format json`) under
cutetune/shipped_winners/, tuned on the GPUs they name by the whole-model tuning command, and
served after the user's own winners (the dispatcher says which served each bucket)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from cutetune.results_db.export import read_winners
from cutetune.results_db.fingerprint import DeviceFingerprint, choose_to_serve
from cutetune.results_db.records import Winner

SHIPPED_DIR = "shipped_winners"


def shipped_winners(here: DeviceFingerprint, directory: Path | None = None) -> list[Winner]:
    """The shipped winners this device may serve (the fingerprint policy), from every JSON file
    in `directory` (default: the package's)."""
    return choose_to_serve(shipped_with_devices(directory), here)


def shipped_with_devices(directory: Path | None = None
                         ) -> list[tuple[DeviceFingerprint, Winner]]:
    """Every shipped winner with the device it was measured on, from every JSON file in
    `directory` (default: the package's)."""
    folder = directory or Path(str(resources.files("cutetune") / SHIPPED_DIR))
    if not folder.is_dir():
        return []
    return [pair for path in sorted(folder.glob("*.json"))
            for pair in read_winners(path.read_text(), "json")]
