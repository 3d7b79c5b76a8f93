"""Where a short profiled fit's cost goes: in one process, the default profile against the same with probes left out of its
session (bench only), each round a plain fit then every variant in shuffled order; medians of (variant − plain fit of
the round), in CPU (process) time and wall time.

Workload: the bench's tiny MLP (`bench.common.mlp_learner`), 20 training + 2 validation batches of 64 (`--batches`), one
thread, `learn.profile(show_report=False, logger_callback=None)`. A variant named `A,B` leaves probes `A` and `B` out
(their class names); `pair` leaves every probe out but the timing pair (and the `Session` itself).

    python -m bench.components [--batches 20] [--rounds 40] [--seed 0] [VARIANT ...]
    python -m bench.components LayerTimer CostSampler LoadTimer pair"""
from __future__ import annotations
import argparse, random, statistics, sys, time

PAIR = ('SimpleProfilerCallback', 'SimpleProfilerPostCallback')

def run(variants:list, batches:int=20, rounds:int=40, seed:int=0, log=print) -> dict:
    "Medians of (variant − plain fit) over `rounds`, in ms of CPU and wall time, for 'default' and each of `variants`"
    import torch
    torch.set_num_threads(1)
    import fastprofile.learner as fl
    from .common import mlp_learner
    made,leave = fl._session,[None]
    def session(*a, **k):  # the session of the next call, probes named in `leave` taken out
        s = made(*a, **k)
        out = leave[0]
        if out:
            keep = (lambda n: n in PAIR) if out == 'pair' else (lambda n: n not in out)
            s.probes = [p for p in s.probes if keep(type(p).__name__)]
            if out == 'pair' or 'CostSampler' in out: s.profile.on_batch = None  # the sampler is also the profile's per-batch hook
        return s
    fl._session = session
    try:
        learn = mlp_learner(n_batches=batches, bs=64, n_valid_batches=2)
        spec = {'default': ()} | {v: ('pair' if v == 'pair' else tuple(v.split(','))) for v in variants}
        def fit(v):
            if v is not None: leave[0] = spec[v]; learn.profile(show_report=False, logger_callback=None)
            t,c = time.perf_counter(),time.process_time()
            learn.fit(1, lr=1e-3)
            return time.perf_counter() - t,time.process_time() - c
        for v in [None, *spec]: fit(v); fit(v)  # warm-up
        rng,names = random.Random(seed),list(spec)
        got = {v: [] for v in spec}
        for r in range(rounds):
            w0,c0 = fit(None)
            rng.shuffle(names)
            for v in names:
                w,c = fit(v)
                got[v].append((w - w0, c - c0))
            if (r+1) % 10 == 0: log(f"[bench] components round {r+1}/{rounds}")
        return {v: dict(cpu=1e3*statistics.median(c for _,c in xs), wall=1e3*statistics.median(w for w,_ in xs), rounds=len(xs))
                for v,xs in got.items()}
    finally: fl._session = made

def table(res:dict, batches:int) -> str:
    label = lambda v: 'the default profile' if v == 'default' else 'the pair and the session alone' if v == 'pair' else f"without {v.replace(',', ', ')}"
    rows = [f"| {label(v)} | {r['cpu']:+.2f} | {r['wall']:+.2f} | {r['rounds']} |" for v,r in res.items()]
    return '\n'.join([f"Tiny MLP, {batches} + 2 batches of 64, one thread; ms over the plain fit of each round (medians).", '',
                      '| variant | CPU ms | wall ms | rounds |', '|---|---|---|---|', *rows])

if __name__ == '__main__':
    ap = argparse.ArgumentParser(prog='python -m bench.components', description=__doc__.splitlines()[0])
    ap.add_argument('variants', nargs='*', default=['LayerTimer', 'CostSampler', 'LoadTimer', 'pair'])
    ap.add_argument('--batches', type=int, default=20); ap.add_argument('--rounds', type=int, default=40)
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    print(table(run(a.variants, a.batches, a.rounds, a.seed, log=lambda s: print(s, file=sys.stderr, flush=True)), a.batches))
