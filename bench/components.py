"""Where a short profiled fit's cost goes: in one process, the default profile against the same with probes left out of its
session (bench only), each round a plain fit then every variant in shuffled order; medians of (variant − plain fit of
the round), in CPU (process) time and wall time.

Workload: the bench's tiny MLP (`bench.common.mlp_learner`), 20 training + 2 validation batches of 64 (`--batches`), one
thread, `learn.profile(show_report=False, logger_callback=None)`. A variant named `A,B` leaves probes `A` and `B` out
(their class names); `pair` leaves every probe out but the timing pair (and the `Session` itself).

    python -m bench.components [--batches 20] [--rounds 40] [--seed 0] [VARIANT ...]
    python -m bench.components LayersProbe CallbackCostsProbe LoadingProbe pair
    python -m bench.components --baseline DIR [--processes 4] [VARIANT ...]

`--baseline DIR` (a folder holding another `fastprofile` package: `git archive <commit> fastprofile | tar -x -C DIR`): the
same measurement in `--processes` fresh processes per code version, this tree's and the baseline's alternating (A B B A
...), in one run; per variant, the median over each code version's processes of their medians, and their range."""
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
            if out == 'pair' or 'CallbackCostsProbe' in out: s.profile.on_batch = None  # the sampler is also the profile's per-batch hook
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

def _label(v:str) -> str:
    return ('the default profile' if v == 'default' else 'the pair and the session alone' if v == 'pair' else
            f"without {v.replace(',', ', ')}")

def table(res:dict, batches:int) -> str:
    rows = [f"| {_label(v)} | {r['cpu']:+.2f} | {r['wall']:+.2f} | {r['rounds']} |" for v,r in res.items()]
    return '\n'.join([f"Tiny MLP, {batches} + 2 batches of 64, one thread; ms over the plain fit of each round (medians).", '',
                      '| variant | CPU ms | wall ms | rounds |', '|---|---|---|---|', *rows])

TAG = 'COMPONENTS_RESULT '

def compare(baseline, variants:list, batches:int=20, rounds:int=40, seed:int=0, processes:int=4, log=print) -> dict:
    "`run` in `processes` fresh processes per code version, this tree's and `baseline`'s alternating; code -> variant -> list of results"
    import json, os, subprocess, tempfile
    from pathlib import Path
    from .common import ROOT
    codes = {'this tree': None, 'baseline': Path(baseline).resolve()}
    got = {c: {} for c in codes}
    args = [*variants, '--batches', str(batches), '--rounds', str(rounds), '--json']
    for i in range(processes):
        for code in (list(codes) if i % 2 == 0 else list(codes)[::-1]):
            d,env = codes[code],dict(os.environ)
            paths = ([str(d)] if d else []) + [str(ROOT)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else [])
            env['PYTHONPATH'] = os.pathsep.join(paths)
            with tempfile.TemporaryDirectory(prefix='fastprofile-bench-') as empty:  # first on `sys.path`: `d`'s fastprofile comes first
                r = subprocess.run([sys.executable, '-m', 'bench.components', *args, '--seed', str(seed + i)], capture_output=True,
                                   text=True, cwd=empty if d else ROOT, env=env, timeout=900)
            lines = [l for l in r.stdout.splitlines() if l.startswith(TAG)]
            if r.returncode or not lines:
                raise RuntimeError(f"bench.components failed for {code} (exit {r.returncode}):\n{r.stderr[-3000:]}")
            for v,x in json.loads(lines[-1][len(TAG):]).items(): got[code].setdefault(v, []).append(x)
            log(f"[bench] components: {code}, process {i+1}/{processes}")
    return got

def compare_table(got:dict, batches:int, rounds:int) -> str:
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    span = lambda xs, k: f"{min(x[k] for x in xs):+.2f} … {max(x[k] for x in xs):+.2f}"
    a,b = got['this tree'],got['baseline']
    rows = [f"| {_label(v)} | **{med(b[v], 'cpu'):+.2f}** ({span(b[v], 'cpu')}) | **{med(a[v], 'cpu'):+.2f}** ({span(a[v], 'cpu')}) | "
            f"{med(a[v], 'cpu') - med(b[v], 'cpu'):+.2f} | {med(b[v], 'wall'):+.2f} | {med(a[v], 'wall'):+.2f} |" for v in a if v in b]
    n = len(next(iter(a.values())))
    head = ('| variant | baseline: CPU ms (range) | this tree: CPU ms (range) | this tree − baseline, CPU ms | baseline: wall ms '
            '| this tree: wall ms |')
    return '\n'.join([f"Tiny MLP, {batches} + 2 batches of 64, one thread; ms over the plain fit of each round; per code version the "
                      f"median over {n} processes ({rounds} rounds each) of their medians, and their range.", '',
                      head, '|---|---|---|---|---|---|', *rows])

if __name__ == '__main__':
    ap = argparse.ArgumentParser(prog='python -m bench.components', description=__doc__.splitlines()[0])
    ap.add_argument('variants', nargs='*', default=['LayersProbe', 'CallbackCostsProbe', 'LoadingProbe', 'pair'])
    ap.add_argument('--batches', type=int, default=20); ap.add_argument('--rounds', type=int, default=40)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--baseline', default=None, help="a folder holding another fastprofile package, measured beside this tree's")
    ap.add_argument('--processes', type=int, default=4, help="with --baseline: fresh processes per code version")
    ap.add_argument('--json', action='store_true', help="print the results as one JSON line (what --baseline reads)")
    a = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if a.baseline:
        print(compare_table(compare(a.baseline, a.variants, a.batches, a.rounds, a.seed, a.processes, log), a.batches, a.rounds))
    else:
        res = run(a.variants, a.batches, a.rounds, a.seed, log=log)
        if a.json:
            import json
            print(TAG + json.dumps(res))
        else: print(table(res, a.batches))
