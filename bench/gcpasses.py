"""The garbage collector's passes per fit, plain fastai against `learn.profile(show_report=False)`: objects a profiled call
leaves in reference cycles wait for the collector, whose passes a sweep of short fits pays fit after fit.

Workload: the bench's tiny MLP (`bench.common.mlp_learner`), 20 + 2 batches of 64, one thread, one process; `--fits` fits
of each kind after 10 warm-up fits; the collector's own callbacks (`gc.callbacks`) count and time its passes. To time another
copy of fastprofile (`git archive <commit> fastprofile | tar -x -C DIR`), run from outside the repository with
`PYTHONPATH=DIR:<repository>`.

    python -m bench.gcpasses [--fits 200]"""
from __future__ import annotations
import argparse, gc, time

def gc_passes(fits:int=200) -> dict:
    "'plain' and 'profiled' -> {generation: (passes per fit, µs per fit)}"
    import torch
    torch.set_num_threads(1)
    import fastprofile.all  # noqa: F401
    from .common import mlp_learner
    learn = mlp_learner(n_batches=20, bs=64, n_valid_batches=2)
    out = {}
    for mode in ('plain', 'profiled'):
        def fit():
            if mode == 'profiled': learn.profile(show_report=False, logger_callback=None)
            learn.fit(1, lr=1e-3)
        for _ in range(10): fit()
        n,t,t0 = {},{},[0.]
        def cb(phase, info):
            if phase == 'start': t0[0] = time.perf_counter(); return
            g = info['generation']; n[g] = n.get(g, 0) + 1; t[g] = t.get(g, 0.) + time.perf_counter() - t0[0]
        gc.collect(); gc.callbacks.append(cb)
        try:
            for _ in range(fits): fit()
        finally: gc.callbacks.remove(cb)
        out[mode] = {g: (n[g]/fits, 1e6*t[g]/fits) for g in sorted(n)}
    return out

if __name__ == '__main__':
    ap = argparse.ArgumentParser(prog='python -m bench.gcpasses', description=__doc__.splitlines()[0])
    ap.add_argument('--fits', type=int, default=200)
    a = ap.parse_args()
    import fastprofile
    print(f"fastprofile from {fastprofile.__file__}; {a.fits} fits of each kind\n\n| fits | generation | passes per fit | µs per fit |\n|---|---|---|---|")
    for mode,gens in gc_passes(a.fits).items():
        for g,(n,us) in gens.items(): print(f"| {mode} | {g} | {n:.3f} | {us:.1f} |")
        if not gens: print(f"| {mode} | — | 0 | 0 |")
