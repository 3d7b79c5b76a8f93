"""`python -m bench` runs the CPU benchmarks (overhead, memory, accuracy, fitcost) and prints markdown tables.

`python -m bench gpu --out DIR` runs the GPU suite instead (`bench.gpu.suite`: needs CUDA, exits 2 without it).
`python -m bench overhead memory` runs some of them; `python -m bench fitcost` the profiler's cost per fit (`bench.fitcost`:
first fit of a process, later fits, showing the report and its parts; `--baseline DIR` times another copy of fastprofile
beside this tree's). `--trials N` changes the overhead and fitcost trials; `--out FILE` also writes the markdown to FILE,
`--json FILE` the raw measurements (both atomically). Progress goes to stderr, tables to stdout."""
from __future__ import annotations
import argparse, json, os, sys, time, tempfile
from pathlib import Path
from .common import machine_info, machine_md

SECTIONS = ('overhead', 'memory', 'accuracy', 'fitcost')

def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ['gpu']:  # the GPU suite: its own options, its own exit status
        from .gpu.suite import main as gpu_main
        return gpu_main(args[1:])
    if args[:1] == ['verdict']:  # the verdict as a person reads it (`bench.verdict`): its own options
        from .verdict import main as verdict_main
        return verdict_main(args[1:])
    ap = argparse.ArgumentParser(prog='python -m bench', description=__doc__.splitlines()[0])
    ap.add_argument('sections', nargs='*', help=f"any of {', '.join(SECTIONS)} (default: all)")
    ap.add_argument('--trials', type=int, default=None, help="overhead trials per variant (default: 5 for the MLP, 3 for the demo; applies to both)")
    ap.add_argument('--out', type=Path, default=None, help="also write the markdown to this file")
    ap.add_argument('--json', type=Path, default=None, help="also write the raw measurements (JSON) to this file")
    ap.add_argument('--baseline', type=Path, default=None, help="overhead, fitcost: a folder holding another fastprofile package, timed beside this tree's in the same run")
    ap.add_argument('--workloads', default=None, help="overhead: which of mlp, demo, fixed to run (comma-separated; default: all)")
    ap.add_argument('--calibration', type=int, default=0, help="fitcost: also time the pair's calibration settings in this many fresh processes each")
    a = ap.parse_args(argv)
    bad = [s for s in a.sections if s not in SECTIONS]
    if bad: ap.error(f"unknown section(s) {', '.join(map(repr, bad))}: valid values are {', '.join(SECTIONS)}")
    if a.trials is not None and a.trials < 1: ap.error("--trials must be >= 1")
    sections = a.sections or list(SECTIONS)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    info = machine_info()
    cmd = 'python -m bench' + (' ' + ' '.join(sys.argv[1:]) if argv is None and sys.argv[1:] else '')
    parts = ['# fastprofile CPU benchmarks', '', machine_md(info), '', f"Command: `{cmd}` (from the repository root, "
             "project venv active). Every variant runs in its own fresh process per trial; one torch thread.", '']
    from . import overhead, memory, accuracy, fitcost
    raw = {'machine': info}
    for s in sections:
        t = time.perf_counter()
        if s == 'overhead': parts.append(overhead.main(trials=a.trials, log=log, raw=raw, baseline=a.baseline,
                                                       workloads=a.workloads.split(',') if a.workloads else None))
        elif s == 'memory': parts.append(memory.main(log=log, raw=raw))
        elif s == 'fitcost': parts.append(fitcost.main(trials=a.trials, log=log, raw=raw, baseline=a.baseline, calibration=a.calibration))
        else: parts.append(accuracy.main(log=log, raw=raw))
        log(f"[bench] {s} took {time.perf_counter()-t:.0f} s")
    parts.append(f"Total run time: {time.perf_counter()-t0:.0f} s.")
    md = '\n'.join(parts) + '\n'
    print(md)
    if a.out: _atomic_write(a.out, md)
    if a.json: _atomic_write(a.json, json.dumps(raw, indent=1, default=float))
    return 0

def _atomic_write(path:Path, text:str):
    "Write `text` to `path` through a temporary file in the same folder"
    fd,tmp = tempfile.mkstemp(dir=path.parent, prefix='.bench-')
    with os.fdopen(fd, 'w') as f: f.write(text)
    umask = os.umask(0); os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private
    os.replace(tmp, path)

if __name__ == '__main__': sys.exit(main())
