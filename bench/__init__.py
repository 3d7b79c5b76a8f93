"""CPU benchmarks of fastprofile against no profiler and its predecessor (fastxtend 0.1.7): `python -m bench [overhead|memory|accuracy]`.

Kept import-light: the workers (`python -m bench.worker`) import only what their variant needs."""
