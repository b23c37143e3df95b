"""What the tests and the benchmarks share: covering points, stand-ins (a Qwen3-MoE model, a
fault-injecting kernel, fake GPU workers and trial runners), stored rows made by hand, and the
checks several suites run.

Not part of the installed package. It imports from the repository root: pytest puts the root on
sys.path (pyproject.toml, `pythonpath`), and the benchmarks run from the root as modules
(`python3 -m benchmarks.NAME`). A Python child process a test starts gets the same path from
`testkit.child_process.child_env`.
"""
