"""The tuning report: one model's tuning results read back from the database, as tables
(`cutetune report --format md`) and figures (the notebook `tuning_report.ipynb`, which
`cutetune report` runs headless into one HTML file)."""
