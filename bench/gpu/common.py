"Shared pieces of the GPU suite's parts: results saved as they come, time limits, GPU timers, fastai timing callbacks"
from __future__ import annotations
import copy, json, math, os, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# ---------------------------------------------------------------- files, progress, limits

def atomic_write(path, text:str) -> Path:
    "Write `text` to `path` through a temporary file in the same folder (readers never see half a file)"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd,tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.')
    try:
        with os.fdopen(fd, 'w') as f: f.write(text)
        umask = os.umask(0); os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp): os.unlink(tmp)
        raise
    return path

def clean(o):
    "`o` with NaN and infinities as None, tuples as lists and numpy scalars as Python numbers: strict JSON"
    if isinstance(o, dict): return {str(k):clean(v) for k,v in o.items()}
    if isinstance(o, (list, tuple)): return [clean(v) for v in o]
    if hasattr(o, 'item') and not isinstance(o, (str, bytes)): o = o.item()
    if isinstance(o, float) and not math.isfinite(o): return None
    return o

def log(msg:str, part:str='gpu'):
    "One progress line on stderr"
    print(f"[{part}] {msg}", file=sys.stderr, flush=True)

class Deadline:
    "Seconds left of a budget that started at creation"
    def __init__(self, seconds:float): self.seconds,self.t0 = float(seconds),time.monotonic()
    def elapsed(self) -> float: return time.monotonic() - self.t0
    def left(self) -> float: return self.seconds - self.elapsed()

class Results:
    "A part's results: a dict saved atomically as JSON to `path` at every `save()`, so a part killed mid-way leaves what it had"
    def __init__(self, path=None, part:str=''):
        self.path,self.data = (Path(path) if path else None),{'part':part, 'status':'running', 'stand_ins':stand_ins_active()}
    def __getitem__(self, k): return self.data[k]
    def __setitem__(self, k, v): self.data[k] = v
    def setdefault(self, k, v): return self.data.setdefault(k, v)
    def save(self):
        if self.path is not None: atomic_write(self.path, json.dumps(clean(self.data), indent=1))

def merged(defaults:dict, override:dict|None) -> dict:
    "A deep copy of `defaults` updated by `override`, dict values merged key by key"
    out = copy.deepcopy(defaults)
    for k,v in (override or {}).items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out

def stand_ins_active() -> bool:
    "True when `bench.gpu.fakes` replaced `torch.cuda` in this process: nothing it measures is a result"
    fk = sys.modules.get('bench.gpu.fakes')
    return bool(fk is not None and fk.INSTALLED)

def median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs: return math.nan
    xs = sorted(xs); n = len(xs)
    return xs[n//2] if n % 2 else (xs[n//2-1] + xs[n//2])/2

# ---------------------------------------------------------------- the machine

def device_info() -> dict:
    "The GPU, the versions and the date, for the markdown's header"
    import platform, datetime, torch
    info = {'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
            'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
            'cpus': os.cpu_count()}
    for mod in ('fastai', 'fastprofile'):
        try: info[mod] = __import__(mod).__version__
        except Exception as e: info[mod] = f'not importable ({type(e).__name__})'
    try:
        p = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), memory_gb=round(p.total_memory/2**30, 1),
                    capability=f'{p.major}.{p.minor}', gpus=torch.cuda.device_count())
    except Exception as e: info['device'] = f'unknown ({type(e).__name__}: {e})'
    try:
        import subprocess
        r = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip(): info['driver'] = r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError): pass
    return info

# ---------------------------------------------------------------- GPU timers

def sync(device='cuda'):
    "Wait for the GPU `device` (nothing on a CPU device)"
    import torch
    if torch.device(device).type == 'cuda': torch.cuda.synchronize(device)

def spin_per_ms(device='cuda') -> float:
    "`torch.cuda._sleep` cycles per millisecond on this GPU (`bench.gpu_timing.cycles_for`, cached)"
    global _PER_MS
    if _PER_MS is None:
        from bench.gpu_timing import cycles_for
        _PER_MS = cycles_for(dict(ms=1000.))['ms']/1000.
    return _PER_MS
_PER_MS = None

def cuda_time(f, n:int=20, warmup:int=3, hold_ms:float=100.) -> float:
    "Mean GPU seconds of `f()` by CUDA events; the GPU is held by a spin while the `n` calls are queued, so host time is not in the span"
    import torch
    for _ in range(warmup): f()
    s,e = torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(hold_ms*spin_per_ms()))
    s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e)/1e3/n

def host_time(f, n:int=10, warmup:int=2, device='cuda') -> float:
    "Mean wall seconds of `f()` with the GPU synchronized before and after (for work the host waits for, e.g. a pageable copy)"
    for _ in range(warmup): f()
    sync(device); t0 = time.perf_counter()
    for _ in range(n): f()
    sync(device)
    return (time.perf_counter() - t0)/n

# ---------------------------------------------------------------- fastai pieces (fastai imported when used)

def step_timer(skip:int, device='cuda'):
    "A callback measuring wall seconds per training batch after the first `skip`, the GPU synchronized at both ends: `.per_batch`"
    from fastai.callback.core import Callback
    class StepTimer(Callback):
        "From the end of batch `skip-1` to the end of the last batch: what the profiler does at the phase's end is left out"
        order = 3000  # after everything, the profiler included
        def __init__(self): self.t0,self.n,self.per_batch = None,0,math.nan
        def before_train(self): self.t0,self.n = None,0
        def after_batch(self):
            if not self.training: return
            if self.iter == skip-1: sync(device); self.t0 = time.perf_counter()
            elif self.iter >= skip: self.n += 1
            if self.iter == self.n_iter-1 and self.t0 is not None and self.n:
                sync(device); self.per_batch = (time.perf_counter() - self.t0)/self.n
    return StepTimer()

def quiet_fit(learn, n_epoch:int=1):
    "Fit with no progress bar and no epoch table"
    import warnings
    bars = [cb for cb in learn.cbs if type(cb).__name__ == 'ProgressCallback']
    with learn.removed_cbs(bars), learn.no_logging(), warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)  # fastai's and the prefetch's one-off notes
        learn.fit(n_epoch)
    return learn

def free(device='cuda'):
    "Collect the last learner (a reference cycle) and give its GPU memory back"
    import gc, torch
    gc.collect()
    if torch.device(device).type == 'cuda': torch.cuda.empty_cache()

def load_xresnet():
    "fastai's `xresnet` module, loaded from its file so that `fastai.vision.models` (which imports torchvision) is never imported"
    import importlib.util, fastai
    name = 'fastai.vision.models.xresnet'
    if name in sys.modules: return sys.modules[name]
    path = Path(fastai.__file__).parent/'vision'/'models'/'xresnet.py'
    spec = importlib.util.spec_from_file_location('bench_gpu_xresnet', path)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = 'fastai.vision.models'  # its relative imports: fastai.torch_basics, fastai.layers
    blocked = 'torchvision' not in sys.modules
    if blocked: sys.modules['torchvision'] = None  # its optional torchvision import fails fast (ModuleNotFoundError)
    try: spec.loader.exec_module(mod)
    finally:
        if blocked: sys.modules.pop('torchvision', None)
    return mod
