"Shared helpers for the benchmarks: the machine, the predecessor's install, worker subprocesses, workloads and tables"
from __future__ import annotations
import json, os, platform, subprocess, sys, datetime, statistics, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FASTXTEND_VERSION = '0.1.7'
RESULT_TAG = 'BENCH_RESULT '

# ---------------------------------------------------------------- the machine

def cpu_model() -> str:
    "CPU model name from /proc/cpuinfo (or `platform.processor()`)"
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'): return line.split(':', 1)[1].strip()
    except OSError: pass
    return platform.processor() or 'unknown'

def machine_info() -> dict:
    "CPU, cores, Python/torch/fastai/fastprofile versions and the date, for the tables' header"
    import torch, fastai, fastprofile
    return {'date': datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z'),
            'cpu': cpu_model(), 'cores': os.cpu_count(), 'python': platform.python_version(),
            'torch': torch.__version__, 'fastai': fastai.__version__, 'fastprofile': fastprofile.__version__,
            'os': f"{platform.system()} {platform.release()}"}

def machine_md(info:dict) -> str:
    return (f"Machine: {info['cpu']}, {info['cores']} cores, {info['os']}; Python {info['python']}, torch {info['torch']}, "
            f"fastai {info['fastai']}, fastprofile {info['fastprofile']}. Date: {info['date']}.")

# ---------------------------------------------------------------- the predecessor (fastxtend 0.1.7)

class PredecessorUnavailable(RuntimeError): pass

def fastxtend_dir() -> Path:
    "A folder holding fastxtend 0.1.7 (installed there with `pip --no-deps --target` if absent); raises `PredecessorUnavailable`"
    env = os.environ.get('FASTPROFILE_BENCH_FASTXTEND')
    cache = Path(os.environ.get('XDG_CACHE_HOME', Path.home()/'.cache'))/'fastprofile-bench'/f'fastxtend-{FASTXTEND_VERSION}'
    d = Path(env) if env else cache
    if (d/'fastxtend'/'callback'/'profiler.py').exists(): return d
    if env: raise PredecessorUnavailable(f"FASTPROFILE_BENCH_FASTXTEND={env} holds no fastxtend/callback/profiler.py")
    cmd = [sys.executable, '-m', 'pip', 'install', '--quiet', '--no-deps', '--target', str(d), f'fastxtend=={FASTXTEND_VERSION}']
    print(f"[bench] installing the predecessor: {' '.join(cmd)}", file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode or not (d/'fastxtend'/'callback'/'profiler.py').exists():
        raise PredecessorUnavailable(f"could not install fastxtend=={FASTXTEND_VERSION} into {d} "
                                     f"(pip exit {r.returncode}): {r.stderr.strip()[-500:]}")
    return d

# ---------------------------------------------------------------- worker subprocesses

def run_worker(task:dict, predecessor:Path|None=None, timeout:float=300, fastprofile_from:Path|None=None) -> dict:
    """Run `python -m bench.worker` on `task` in a fresh process (with fastxtend importable if `predecessor`); its JSON result.
    `fastprofile_from`: a folder holding another `fastprofile` package, imported instead of this tree's (the bench stays this tree's)"""
    env = dict(os.environ)
    paths = ([str(fastprofile_from)] if fastprofile_from else []) + [str(ROOT)] + ([str(predecessor)] if predecessor else [])
    env['PYTHONPATH'] = os.pathsep.join(paths + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    env.setdefault('OMP_NUM_THREADS', '1'); env.setdefault('MKL_NUM_THREADS', '1')
    env['WANDB_MODE'] = 'disabled'
    with tempfile.TemporaryDirectory(prefix='fastprofile-bench-') as empty:
        # `python -m` puts its working folder first on `sys.path`: an empty one, so that `fastprofile_from` comes first
        r = subprocess.run([sys.executable, '-m', 'bench.worker', json.dumps(task)], capture_output=True, text=True,
                           cwd=empty if fastprofile_from else ROOT, env=env, timeout=timeout)
    lines = [l for l in r.stdout.splitlines() if l.startswith(RESULT_TAG)]
    if r.returncode or not lines:
        raise RuntimeError(f"bench worker failed on {task} (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_TAG):])

# ---------------------------------------------------------------- workloads (imported inside workers only)

def quiet(learn):
    "No progress bar, no epoch table: the same callbacks in every variant"
    from fastcore.basics import noop
    learn.remove_cbs([cb for cb in learn.cbs if type(cb).__name__ == 'ProgressCallback'])
    learn.logger = noop
    return learn

def mlp_learner(n_batches:int=500, bs:int=64, n_valid_batches:int=2, n_in:int=16, seed:int=0):
    "Worst case for a profiler: a tiny MLP on in-memory tensors, `n_batches` training batches of `bs`, no workers"
    import torch
    from torch import nn
    from fastai.basics import DataLoaders, Learner, MSELossFlat
    g = torch.Generator().manual_seed(seed)
    n = (n_batches + n_valid_batches)*bs
    x = torch.randn(n, n_in, generator=g)
    y = x @ torch.randn(n_in, 1, generator=g) + 0.1*torch.randn(n, 1, generator=g)
    items = list(zip(x, y))
    dls = DataLoaders.from_dsets(items[:n_batches*bs], items[n_batches*bs:], bs=bs, num_workers=0, shuffle=True)
    model = nn.Sequential(nn.Linear(n_in, 32), nn.ReLU(), nn.Linear(32, 1))
    return quiet(Learner(dls, model, loss_func=MSELossFlat()))

def demo_learner(n_train:int=640, n_valid:int=128, bs:int=64):
    "The demo workload: `fastprofile.demo.make_demo_learner` (JPEGs decoded with PIL, a small CNN), on the CPU"
    from fastprofile.demo import make_demo_learner
    return quiet(make_demo_learner(n_train=n_train, n_valid=n_valid, bs=bs, workers=0, device='cpu'))

# ---------------------------------------------------------------- numbers and tables

def median(xs): return statistics.median(xs) if xs else float('nan')

def iqr(xs):
    "Interquartile range (0 for fewer than 4 values: the spread is then max - min)"
    if len(xs) < 4: return (max(xs) - min(xs)) if xs else float('nan')
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]

def md_table(headers:list, rows:list) -> str:
    "A markdown table"
    out = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join('---' for _ in headers) + '|']
    out += ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]
    return '\n'.join(out)

def fmt(x, spec='.0f', unit=''):
    "Format a number, or '—' for None/NaN"
    if x is None or (isinstance(x, float) and x != x): return '—'
    return f"{x:{spec}}{unit}"

def fmt_bytes(n):
    if n is None: return '—'
    for u,s in (('GB',1e9),('MB',1e6),('kB',1e3)):
        if abs(n) >= s: return f"{n/s:.3g} {u}" if abs(n)/s < 100 else f"{n/s:.0f} {u}"
    return f"{n:.0f} B"
