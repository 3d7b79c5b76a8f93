"""What telemetry costs on a CPU: the clock reads, and profiled fits with telemetry off, per phase (the CPU default) and sampled.

    python -m bench.telemetry [--trials 5] [--batches 500] [--json FILE]

1. µs per call of the clocks the probe reads at each phase's start and end (`time.process_time`, `time.perf_counter`)
   and, for comparison, `os.times` and `resource.getrusage`;
2. a tiny MLP (16-32-1, bs 64, the profiler's worst case) fitted `--trials` times per variant, variants interleaved in
   one process: `telemetry=False`, `'auto'` (the CPU default: CPU time per phase, no thread), `True` with the sampler
   every 50 ms and every 5 ms. Per variant: median wall and CPU (process) time per training batch; for the sampler,
   samples taken against those asked for, and its own time per sample (on its thread).
The GPU side (NVML reads, the sampler beside a GPU fit, the out-of-memory snapshot) is the `telemetry` part of
`python -m bench gpu`. Tables go to stdout, progress to stderr.
"""
from __future__ import annotations
import argparse, json, os, resource, time
from pathlib import Path
from .common import machine_info, machine_md, md_table, fmt, median, quiet, mlp_learner

log = lambda s: print(s, file=os.sys.stderr, flush=True)

def clock_costs(n:int=200_000) -> dict:
    "µs per call of each clock"
    out = {}
    for name,f in (('time.process_time', time.process_time), ('time.perf_counter', time.perf_counter), ('os.times', os.times),
                   ('resource.getrusage', lambda: resource.getrusage(resource.RUSAGE_SELF))):
        best = float('inf')
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n): f()
            best = min(best, (time.perf_counter() - t0)/n)
        out[name] = best*1e6
    return out

VARIANTS = {'off': dict(telemetry=False), 'auto (per phase)': dict(), 'sampler 50 ms': dict(telemetry=True),
            'sampler 5 ms': dict(telemetry=True, telemetry_every=.005)}

def fits(trials:int, batches:int) -> dict:
    "Per variant: wall and CPU seconds per training batch of each trial; the sampler's samples and cost"
    import torch
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    torch.set_num_threads(1)
    out = {k:dict(wall=[], cpu=[], samples=[], asked=[], per_sample=[]) for k in VARIANTS}
    learn = quiet(mlp_learner(batches))
    learn.fit(1)  # warm-up: the first fit of a process pays once-per-process costs
    for t in range(trials):
        for name,opts in VARIANTS.items():
            learn.profile(show_report=False, logger_callback=None, **opts)
            c0,w0 = time.process_time(),time.perf_counter()
            learn.fit(1)
            w,c = time.perf_counter() - w0,time.process_time() - c0
            n = len(learn.dls.train)
            o = out[name]
            o['wall'].append(w/n); o['cpu'].append(c/n)
            tel = learn.simple_profile.facts.telemetry
            if tel is not None and tel.sampled:
                o['samples'].append(tel.samples); o['asked'].append((tel.last - tel.first)/tel.every + 1)
                o['per_sample'].append(tel.cost/tel.samples)
        log(f"[bench.telemetry] trial {t+1}/{trials}")
    return out

def tables(d:dict) -> str:
    cc = d['clocks']
    out = ["### Clock reads", '', md_table(['clock', 'µs per call'], [[f"`{k}`", fmt(v, '.2f')] for k,v in cc.items()]), '',
           f"The probe reads `time.process_time` and `time.perf_counter` at each phase's start and end: "
           f"{2*(cc['time.process_time'] + cc['time.perf_counter']):.1f} µs per phase, nothing per batch.", '']
    f = d['fits']
    base_w,base_c = median(f['off']['wall']),median(f['off']['cpu'])
    rows = []
    for k,o in f.items():
        w,c = median(o['wall']),median(o['cpu'])
        rows.append([k, fmt(w*1e6, '.0f', ' µs'), fmt((w - base_w)*1e6, '+.1f', ' µs') if k != 'off' else '—',
                     fmt(c*1e6, '.0f', ' µs'), fmt((c - base_c)*1e6, '+.1f', ' µs') if k != 'off' else '—',
                     f"{median(o['samples']):.0f} of {median(o['asked']):.0f}" if o['samples'] else '—',
                     fmt(median(o['per_sample'])*1e6, '.0f', ' µs') if o['per_sample'] else '—'])
    out += [f"### Profiled fits: tiny MLP, {d['batches']} batches, {d['trials']} trials per variant (interleaved, one process, one torch thread)", '',
            md_table(['telemetry', 'wall per batch', 'over off', 'CPU per batch', 'over off', 'samples (taken of asked)', 'sampler per sample'], rows)]
    return '\n'.join(out)

def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.telemetry', description=__doc__.splitlines()[0])
    ap.add_argument('--trials', type=int, default=5, help="fits per variant (default 5)")
    ap.add_argument('--batches', type=int, default=500, help="training batches per fit (default 500)")
    ap.add_argument('--json', type=Path, default=None, help="also write the raw measurements to this file")
    a = ap.parse_args(argv)
    t0,load0 = time.perf_counter(),os.getloadavg()[0]
    d = dict(machine=machine_info(), trials=a.trials, batches=a.batches)
    log('[bench.telemetry] clocks'); d['clocks'] = clock_costs()
    log('[bench.telemetry] fits'); d['fits'] = fits(a.trials, a.batches)
    d['load'] = (load0, os.getloadavg()[0])
    print('\n'.join([machine_md(d['machine']), '', tables(d), '', f"Run time: {time.perf_counter()-t0:.0f} s; 1-minute load average "
                     f"{d['load'][0]:.1f} at the start, {d['load'][1]:.1f} at the end (on {os.cpu_count()} cores)."]))
    if a.json: a.json.write_text(json.dumps(d, indent=1, default=str))

if __name__ == '__main__': main()
