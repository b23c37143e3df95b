"""Alembic's migrations of cutetune's own tables (Optuna versions its tables itself): env.py
runs them on the connection migrate.py hands it; versions/ holds one revision per change."""
