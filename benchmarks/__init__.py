"""The benchmark tools, each a module run from the repository root: `python3 -m benchmarks.NAME`
(the GPU machine runs them with the root on PYTHONPATH, which does as well). They share the tests'
helpers through `testkit`, and take what they time through cutetune's public seams (the serving
table's `Dispatcher.stand_in` for host time). Their measurements are under `results/`, from which
`benchmarks_md` generates BENCHMARKS.md."""
