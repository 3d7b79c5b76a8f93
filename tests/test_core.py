"Fault matrix, known costs and invariants of the profiler pair on real fastai Learners"
import math, time, warnings, gc
import numpy as np, pandas as pd, pytest, torch
from torch import nn
from torch.utils.data import Dataset
from fastai.basics import *
from fastai.callback.all import *
from fastai.test_utils import synth_learner, synth_dbunch, RegModel
from fastprofile.all import *

def _noreport(learn, **kw):
    kw.setdefault('show_report', False); kw.setdefault('logger_callback', None)
    return learn.profile(**kw)

def _rows(learn): return learn.simple_profile_results.set_index(['Phase','Action','Step'])

def check_sums(res, tol=1e-6):
    "Children sum to their parents in a results frame"
    T = res['Total Time']
    get = lambda k: T.get(k, 0.)
    assert math.isclose(get(('fit','train',''))+get(('fit','valid',''))+get(('fit','other','')), get(('fit','fit','')), abs_tol=tol)
    for p,steps in (('train',['forward','loss','backward','opt_step','zero_grad','other']),('valid',['predict','loss','other'])):
        if ('fit',p,'') not in T: continue
        assert math.isclose(sum(get((p,'batch',s)) for s in steps), get((p,'batch','')), abs_tol=tol)
        assert math.isclose(get((p,'warmup',''))+get((p,'draw',''))+get((p,'batch',''))+get((p,'other','')), get(('fit',p,'')), abs_tol=tol)
    assert (res['Samples/Second'].dropna() >= 0).all()

def _losses(make, profile, n_epoch=2, **fit_kw):
    set_seed(7, reproducible=True)
    learn = make()
    if profile: _noreport(learn)
    learn.fit(n_epoch, 1e-2, **fit_kw)
    return learn, [float(v) for v in L(learn.recorder.losses)], [list(map(float, v)) for v in learn.recorder.values]

# ---- the fault matrix: every Cancel*Exception at its event ----
_PHASE_EVENTS = ('before_epoch','before_train','after_train','before_validate','after_validate','after_epoch')

class Raiser(Callback):
    "Raise `exc` at `event`: on batch `at` of each training phase, or in the second epoch for phase events"
    order = 65  # among the other callbacks, after fastai's ProgressCallback (which crashes on a cancelled before_train)
    def __init__(self, event, exc, at=2, train=True): self.event,self.exc,self.at,self.train_only = event,exc,at,train
    def before_fit(self): self.raised = 0
    def __call__(self, event_name):
        if event_name == self.event:
            hit = (getattr(self.learn, 'epoch', 0) == 1 if event_name in _PHASE_EVENTS else
                   (not self.train_only or self.learn.training) and getattr(self.learn, 'iter', -1) == self.at)
            if hit: self.raised += 1; raise self.exc()
        return super().__call__(event_name)

CASES = [('before_batch', CancelBatchException), ('after_pred', CancelBatchException), ('after_loss', CancelBatchException),
         ('before_backward', CancelBackwardException), ('after_backward', CancelBatchException),
         ('before_step', CancelStepException), ('after_step', CancelBatchException), ('after_batch', CancelTrainException),
         ('before_draw', CancelTrainException), ('after_batch', CancelEpochException), ('after_batch', CancelFitException),
         ('before_train', CancelTrainException), ('before_validate', CancelValidException), ('after_train', CancelEpochException)]

@pytest.mark.parametrize('event,exc', CASES, ids=[f'{e}-{x.__name__}' for e,x in CASES])
def test_cancel_matrix(event, exc):
    make = lambda: synth_learner(n_trn=6, n_val=3, cbs=Raiser(event, exc, train=event not in ('before_validate',)))
    _,l0,v0 = _losses(make, False)
    learn,l1,v1 = _losses(make, True)
    assert learn.raiser.raised >= 1                    # the exception really was raised
    assert l1 == l0 and v1 == v0                       # same training with and without the profiler
    res = learn.simple_profile_results
    check_sums(res.set_index(['Phase','Action','Step']))
    assert not any(isinstance(cb, (SimpleProfilerCallback, SimpleProfilerPostCallback)) for cb in learn.cbs)

def test_cancel_backward_skips_backward_only():
    learn = synth_learner(n_trn=6, n_val=2, cbs=Raiser('before_backward', CancelBackwardException, at=3))
    _noreport(learn).fit(1)
    r = _rows(learn)
    assert r.loc[('train','batch','backward'),'Number of Calls'] == 6-1-1   # warm-up and the cancelled one left out
    assert r.loc[('train','batch','opt_step'),'Number of Calls'] == 6-1

class ClosingDL:
    "Wraps a loader; records whether its iterator was closed"
    def __init__(self, dl): self.dl,self.closed = dl,False
    def __len__(self): return len(self.dl)
    def __getattr__(self, k): return getattr(self.dl, k)
    def __iter__(self):
        try: yield from self.dl
        finally: self.closed = True

def test_keyboard_interrupt_keeps_partial_report_and_closes_loader():
    class Stop(Callback):
        def after_pred(self):
            if self.training and self.iter == 4: raise KeyboardInterrupt
    learn = synth_learner(n_trn=10, n_val=2, cbs=Stop())
    dl = learn.dls.train = ClosingDL(learn.dls.train)
    with pytest.raises(KeyboardInterrupt): _noreport(learn).fit(1)
    assert dl.closed
    r = _rows(learn)
    assert r.loc[('train','draw',''),'Number of Calls'] == 3
    assert 'Partial profile' in learn.simple_profile_report.plain()

# ---- fastai entry points ----
def test_lr_find_fine_tune_get_preds_validate():
    learn = synth_learner(n_trn=8, n_val=2)
    _noreport(learn)
    learn.lr_find(num_it=6, show_plot=False)
    preds,targs = learn.get_preds()
    assert len(preds) == 32
    learn.validate()
    assert 'simple_profile_record' not in learn.__dict__
    learn.fine_tune(1, 1e-2, freeze_epochs=1)   # two fits: the first profiled, then the pair is gone
    r = _rows(learn)
    assert r.loc[('train','draw',''),'Number of Calls'] == 8-1
    assert not any(isinstance(cb, SimpleProfilerCallback) for cb in learn.cbs)

def test_gradient_accumulation():
    make = lambda: synth_learner(data=synth_dbunch(bs=4, n_train=8, n_valid=2), cbs=GradientAccumulation(n_acc=8))
    _,l0,v0 = _losses(make, False)
    learn,l1,v1 = _losses(make, True)
    assert l1 == l0 and v1 == v0
    r = _rows(learn)
    # the optimizer steps every other batch: opt_step is timed only where it ran
    assert 0 < r.loc[('train','batch','opt_step'),'Number of Calls'] < r.loc[('train','batch','forward'),'Number of Calls']
    check_sums(r)

def test_empty_validation_set_and_bs1():
    learn = synth_learner(data=synth_dbunch(bs=1, n_train=5, n_valid=1))
    learn.dls.valid = learn.dls.valid.new(torch.utils.data.TensorDataset(*[t[:0] for t in learn.dls.valid_ds.tensors]))
    _noreport(learn).fit(1)
    r = _rows(learn)
    assert ('valid','draw','') not in r.index
    assert r.loc[('train','draw',''),'Samples/Second'] > 0
    check_sums(r)

class SlowDS(Dataset):
    "Items that take `delay` seconds each to load"
    def __init__(self, n, delay=0., fail_at=None): self.n,self.delay,self.fail_at = n,delay,fail_at
    def __len__(self): return self.n
    def __getitem__(self, i):
        if i == self.fail_at: raise RuntimeError(f'bad item {i}')
        if self.delay: time.sleep(self.delay)
        x = torch.full((1,), float(i%7)); return x, 2*x+1

def _learner(ds_train, ds_valid, bs=4, workers=0, **kw):
    dls = DataLoaders.from_dsets(ds_train, ds_valid, bs=bs, num_workers=workers)
    return Learner(dls, RegModel(), loss_func=MSELossFlat(), lr=1e-2, **kw)

def test_loader_that_raises_reaches_user():
    learn = _learner(SlowDS(32, fail_at=9), SlowDS(8))
    with pytest.raises(RuntimeError, match='bad item 9'): _noreport(learn).fit(1)

@pytest.mark.slow
def test_num_workers_draw_is_the_wait():
    "With 2 workers the draw per batch is about half the loading time; all loader processes end"
    import multiprocessing as mp
    res = {}
    for w in (0, 2):
        learn = _learner(SlowDS(96, delay=0.004), SlowDS(16), bs=8, workers=w)
        _noreport(learn).fit(1)
        res[w] = _rows(learn).loc[('train','draw',''),'Mean Duration']
    assert res[0] > 8*0.004*0.9            # 8 items of 4 ms
    assert res[2] < res[0]*0.8             # workers load in parallel
    gc.collect(); time.sleep(0.5)
    assert not [p for p in mp.active_children() if p.is_alive()]

# ---- known costs ----
class SleepModel(nn.Module):
    def __init__(self, t): super().__init__(); self.t,self.lin = t,nn.Linear(1,1)
    def forward(self, x): time.sleep(self.t); return self.lin(x)

class SleepBackward(torch.autograd.Function):
    t = 0.
    @staticmethod
    def forward(ctx, x): return x.clone()
    @staticmethod
    def backward(ctx, g): time.sleep(SleepBackward.t); return g

def test_known_costs_recovered():
    "Each phase sleeps a known time; the profiler recovers it within max(10%, 1.5 ms)"
    cost = dict(draw=.006, forward=.008, loss=.004, backward=.010, opt_step=.005, zero_grad=.003)
    SleepBackward.t = cost['backward']
    def loss_func(pred, y):
        time.sleep(cost['loss']); return SleepBackward.apply(((pred-y)**2).mean())
    class SleepyOpt(OptimWrapper):
        def step(self):  time.sleep(cost['opt_step']); self.opt.step()
        def zero_grad(self): time.sleep(cost['zero_grad']); self.opt.zero_grad()
    bs = 4
    learn = _learner(SlowDS(10*bs, delay=cost['draw']/bs), SlowDS(3*bs, delay=cost['draw']/bs), bs=bs)
    learn.model = SleepModel(cost['forward'])
    learn.loss_func = loss_func
    learn.opt_func = lambda params, lr: SleepyOpt(params, torch.optim.SGD, lr=lr)
    _noreport(learn).fit(1)
    r = _rows(learn)
    got = dict(draw=r.loc[('train','draw',''),'Mean Duration'], **{k: r.loc[('train','batch',k),'Mean Duration']
               for k in ('forward','loss','backward','opt_step','zero_grad')})
    for k,want in cost.items():
        assert abs(got[k]-want) <= max(0.10*want, 0.0015), (k, got[k], want)
    assert abs(r.loc[('valid','batch','predict'),'Mean Duration'] - cost['forward']) <= max(0.1*cost['forward'], 0.0015)

# ---- bounded memory, driven directly ----
def test_record_memory_bounded():
    "Memory held after 10^5 batches (tracemalloc, everything the record allocated) is no more than after 10^3"
    import tracemalloc
    def held(n):
        clock = FakeClock()
        tracemalloc.start()
        rec = ProfileRecord(clock=clock)
        drive_record(rec, clock, n_epochs=1, n_train=n, n_valid=0)
        rec.fold()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(rec._queue) < rec.fold_every and len(rec.epochs) <= 1
        return size, rec
    (small,_),(big,rec) = held(1_000),held(100_000)
    assert rec.stats[('train','draw')].n == 100_000-1
    assert big <= small*1.05 + 16_384, (small, big)

def test_report_says_prefetch_was_active():
    "With CudaPrefetchCallback staging batches (its CPU stand-in ops here), the report says so; the pair still attributes every second"
    from fastprofile.prefetch import CudaPrefetchCallback, LoggingOps
    learn = synth_learner(n_trn=8, n_val=2, cbs=CudaPrefetchCallback(ops=LoggingOps()))
    _noreport(learn).fit(1)
    assert learn.cuda_prefetch.active
    assert 'CudaPrefetchCallback was active' in learn.simple_profile_report.plain()
    check_sums(_rows(learn))
    learn = synth_learner(n_trn=8, n_val=2)
    _noreport(learn).fit(1)
    assert 'CudaPrefetchCallback' not in learn.simple_profile_report.plain()

# ---- the patched loop is fastai's loop plus before_draw ----
class EventLog(Callback):
    "Every event with fastai's loop state at that moment"
    order = 1
    def before_fit(self): self.log = []
    def __call__(self, event_name):
        if event_name != 'before_draw' and hasattr(self, 'log'):
            self.log.append((event_name, getattr(self.learn, 'iter', None), getattr(self.learn, 'n_iter', None),
                             getattr(self.learn, 'training', None)))
        return super().__call__(event_name)

@pytest.mark.parametrize('extra', ['plain', 'short_epoch', 'empty_valid'])
def test_patched_loop_matches_fastai(extra):
    "Same events, iter and n_iter as fastai's own `all_batches` (ShortEpochCallback, zero-length loaders included)"
    import fastprofile.loop as fl
    def run(patched):
        set_seed(3, reproducible=True)
        learn = synth_learner(n_trn=7, n_val=3, cbs=EventLog())
        if extra == 'empty_valid':
            learn.dls.valid = learn.dls.valid.new(torch.utils.data.TensorDataset(*[t[:0] for t in learn.dls.valid_ds.tensors]))
        cbs = [ShortEpochCallback(pct=0.5)] if extra == 'short_epoch' else []
        saved = Learner.all_batches
        if not patched: Learner.all_batches = fl._fastai_all_batches
        try: learn.fit(2, 1e-2, cbs=cbs)
        finally: Learner.all_batches = saved
        return learn.event_log.log, [float(v) for v in L(learn.recorder.losses)]
    assert run(True) == run(False)

def test_short_epoch_profiled():
    learn = synth_learner(n_trn=10, n_val=4)
    _noreport(learn).fit(1, cbs=ShortEpochCallback(pct=0.5))
    r = _rows(learn)
    check_sums(r)
    assert r.loc[('train','draw',''),'Number of Calls'] + r.loc[('train','warmup',''),'Number of Calls'] == 6  # iters 0..5

def test_failing_report_hook_warns_and_keeps_the_report():
    "A report section (e.g. the diagnosis) that fails warns; the fit, results and the rest of the report are kept"
    import fastprofile.callback as fc
    def broken_section(rep, rec, learn): raise RuntimeError('boom')
    fc.REPORT_HOOKS.append(broken_section)
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter('always')
            learn = synth_learner(n_trn=4, n_val=2)
            _noreport(learn).fit(1)
    finally: fc.REPORT_HOOKS.remove(broken_section)
    assert [w for w in ws if 'broken_section failed' in str(w.message)]
    assert 'Simple Profiler Results' in learn.simple_profile_report.plain()
