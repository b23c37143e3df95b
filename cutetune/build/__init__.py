"""Turning points into files and processes: the artifact store, the compile pool, supervised
worker processes, and the one way a built file is published."""
