"""`python -m bench gpu --out DIR`: every GPU path of fastprofile in one command, written up as one markdown file.

Parts (each in its own process, with a hard time limit): `tests` (`pytest -m cuda tests/`), `timing` (timing modes
against a synchronized truth), `prefetch` (`CudaPrefetchCallback` against the pipeline bound), `diagnosis` (the GPU
branch of the diagnosis), `nvtx` (`annotate()` ranges), `telemetry` (the NVML sampler's rows, energy and cost;
`memory_snapshot=True` on a real out-of-memory error). `bench.gpu.suite` runs them, `bench.gpu.report` writes the
markdown, `bench.gpu.fakes` stands in for `torch.cuda` in the CPU tests (never in a measurement)."""
