"""One figure of the tuning report as a PNG file (the README's comes from this):

    python3 -m benchmarks.report_figure DB_URL MODEL FIGURE OUT.png

FIGURE is one of coverage, bench, speedup, search, roofline (cutetune/report/figures.py).
"""

from __future__ import annotations

import sys

from cutetune.report import figures
from cutetune.report.data import load_report_data


def main(db_url: str, model: str, figure: str, out: str) -> None:
    draw = getattr(figures, f"draw_{figure}", None)
    if draw is None:
        raise SystemExit(f"unknown figure {figure!r}: use coverage, bench, speedup, search or "
                         "roofline")
    with open(out, "wb") as handle:
        handle.write(figures.png(draw(load_report_data(db_url, model))))


if __name__ == "__main__":
    main(*sys.argv[1:])
