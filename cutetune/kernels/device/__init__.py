"""The kernels' device code: their CuTeDSL kernels, launchers and compiles, and the helpers
those share. Only a compile imports it; the kernels' declarations (problems, spaces, defaults,
costs, references) and the ops import none of it, so planning, the ops and a warmup from the
artifact cache run without importing CuTeDSL."""
