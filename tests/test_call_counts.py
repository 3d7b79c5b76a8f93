"""What the default profile adds to a steady-state training batch, counted: Python-level calls (`sys.setprofile`), CUDA
event records, callbacks fastai dispatches to, NVML calls on the training thread.

A count is not a timing: it does not move on a busy machine, so it can hold the profiler's per-batch cost down in CI. The
GPU path runs with `torch.cuda`'s events stood in (`bench.gpu.fakes`, as the GPU suite's CPU tests use: each checked
against torch's real signature) and a stand-in NVML: `timing='events'`, efficiency and the telemetry sampler on, as
`learn.profile()` sets them up on a CUDA learner. The calls counted are those on the training thread (the telemetry
sampler runs on its own); a stand-in's own work is not counted, only the call into it, as a real event's `record` is
one call."""
import collections, sys, threading
import pytest, torch
from torch.utils.data import TensorDataset
from fastai.basics import *
from fastprofile.all import *
from fastprofile.engine.core import ProfileOptions
from fastprofile.engine.gpu_timing import GPU_EVERY
from fastprofile.engine.record import N_MARKS
from test_bench_gpu import fakes  # noqa: F401 (the fixture: `torch.cuda` stood in for this test, put back after)

START,N = 100,128  # count training batches START .. START+N-1: past every first sampling (cost sampler, layer timer, efficiency)
SKIP = ('fakes.py','inspect.py','enum.py','testing.py')  # the stand-ins' own work (signature checks), not the profiler's

class CallCounter(Callback):
    "Last at every event: counts every Python-level call on this thread from the end of training batch START to that of START+N"
    order = 5000
    active = False  # inside the counted window (read by `test_gpu_default_profile_calls_per_batch`'s NVML counter)
    def __init__(self): self.calls,self.by,self.seen = 0,collections.Counter(),[]
    def after_batch(self):
        if not self.training: return
        i = self.learn.train_iter
        if i == START: self.seen = [type(c).__name__ for c in self.learn.cbs]; CallCounter.active = True; sys.setprofile(self._count)
        elif i == START + N: sys.setprofile(None); CallCounter.active = False
    def _count(self, frame, event, arg):
        if event == 'call':
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename.endswith(SKIP): return
            self.calls += 1; self.by[(frame.f_code.co_filename.rsplit('/', 1)[-1], frame.f_code.co_name)] += 1
        elif event == 'c_call':
            if frame.f_code.co_filename.endswith(SKIP): return
            self.calls += 1; self.by[('C', getattr(arg, '__qualname__', str(arg)))] += 1

def _learner():
    "A tiny MLP on 300 training batches of ready tensors: fastai's own work per batch is all there is besides the profiler's"
    torch.manual_seed(0)
    x = torch.randn(64*320, 16); y = x.sum(1, keepdim=True)
    dls = DataLoaders.from_dsets(TensorDataset(x[:64*300], y[:64*300]), TensorDataset(x[64*300:], y[64*300:]), bs=64, device='cpu')
    return Learner(dls, nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), loss_func=MSELossFlat(), opt_func=Adam)

def added_calls(**profile) -> tuple:
    "Calls per steady-state training batch that `learn.profile(**profile)` adds to plain fastai's, the added calls by function, and the callbacks then in `learn.cbs`"
    got = {}
    for variant in ('plain', 'profiled'):
        learn,c = _learner(),CallCounter()
        learn.add_cb(c)
        if variant == 'profiled': learn.profile(show_report=False, logger_callback=None, **profile)
        with learn.no_bar(): learn.fit(1)
        got[variant] = c
    by = collections.Counter(got['profiled'].by); by.subtract(got['plain'].by)
    return (got['profiled'].calls - got['plain'].calls)/N, {k:v/N for k,v in by.items() if v},got["profiled"].seen

def recorded_per_batch() -> tuple:
    "The fewest and most event records a counted batch that the default sampling allows (its constants read from the code)"
    # N_MARKS records on each batch i with (i - warmup) % GPU_EVERY == 0, the window's first counted batch START or START+1
    every,warmup = ProfileOptions().events_every,ProfileOptions().warmup
    assert every == GPU_EVERY > 1  # the default samples: one batch in GPU_EVERY
    k = [sum(i >= warmup and (i - warmup) % every == 0 for i in range(a, a + N)) for a in (START, START + 1)]
    return N_MARKS*min(k)/N - 1e-9, N_MARKS*max(k)/N + 1e-9

def test_cpu_default_profile_calls_per_batch():
    "The default profile on a CPU learner: the pair's table dispatch (17 events), 13 clock reads, one batch end, a counter check"
    n,by,cbs = added_calls()
    assert n <= 100, (n, sorted(by.items(), key=lambda kv: -kv[1])[:15])
    assert by[('callback.py', '__call__')] == 17  # pre 8 events, post 9 (with `before_draw`): nothing else is dispatched to
    assert [c for c in cbs if 'Profiler' in c] == ['SimpleProfilerCallback', 'SimpleProfilerPostCallback']

def test_gpu_default_profile_calls_per_batch(fakes):
    "The default profile on a CUDA learner (events stood in): events on one batch in 7, no efficiency callback once its work is done, no NVML call on the training thread"
    nvml_calls = collections.Counter()
    nv = sys.modules['pynvml']
    for name in [n for n in dir(nv) if n.startswith('nvml')]:  # the training thread's calls into NVML in the window (the sampler's thread is apart)
        f = getattr(nv, name)
        def counted(*a, _f=f, _n=name, **k):
            if CallCounter.active and threading.current_thread() is threading.main_thread(): nvml_calls[_n] += 1
            return _f(*a, **k)
        setattr(nv, name, counted)
    n,by,cbs = added_calls(timing='events', efficiency=True)
    top = sorted(by.items(), key=lambda kv: -kv[1])[:15]
    assert n <= 110, (n, top)  # ~107 with the stand-ins: the CPU path's ~93, a sampled batch's 13 records and its resolve over 7
    lo,hi = recorded_per_batch()
    assert lo <= by.get(('fakes.py', 'record'), 0) <= hi, (lo, hi, top)  # N_MARKS events on one batch in GPU_EVERY, no more, no fewer
    assert 'EfficiencyProbe' not in cbs, cbs  # its FLOPs counted and memory sampled in the warm-up: off `learn.cbs`
    assert not any(k[0] == 'probe.py' for k in by), top  # probes/efficiency/probe.py, probes/telemetry/probe.py
    assert not nvml_calls, nvml_calls  # the sampler's thread reads NVML; the training thread makes no NVML call a batch
