"Scenarios with known bottlenecks: each gets the right verdict and knob, and the predicted speedup of the fix is measured"
import time, math, warnings
import pytest, torch
from torch import nn
from fastai.basics import *
from fastai.data.core import TfmdDL
from fastprofile.learner import *
from fastprofile.diagnosis import diagnose, Diagnosis, diagnosis_section
from fastprofile.advice import check_advice

class SleepyDS(torch.utils.data.Dataset):
    "A regression dataset whose items take `item_sleep` seconds each to load"
    def __init__(self, n, item_sleep=0.):
        self.x = torch.randn(n, 1); self.y = 2*self.x + 3 + .1*torch.randn(n, 1); self.item_sleep = item_sleep
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        if self.item_sleep: time.sleep(self.item_sleep)
        return self.x[i], self.y[i]

class SleepyModel(Module):
    "`y = a x + b`, sleeping `fwd_sleep` seconds in each forward"
    def __init__(self, fwd_sleep=0.):
        self.a,self.b,self.fwd_sleep = nn.Parameter(torch.randn(1)),nn.Parameter(torch.randn(1)),fwd_sleep
    def forward(self, x):
        if self.fwd_sleep: time.sleep(self.fwd_sleep)
        return x*self.a + self.b

class SleepyCallback(Callback):
    "Sleeps after every batch, like a slow logger"
    def __init__(self, s=.005): self.s = s
    def after_batch(self): time.sleep(self.s)

def sleepy_metric(inp, targ):
    time.sleep(.015)
    return (inp-targ).abs().mean()

def slow_sgd(step_sleep):
    "An SGD whose step sleeps `step_sleep` seconds (an optimizer-bound fit)"
    def opt_func(params, lr, **kwargs):
        opt = SGD(params, lr, **kwargs)
        step = opt.step
        def slow_step(*a, **k): time.sleep(step_sleep); return step(*a, **k)
        opt.step = slow_step
        return opt
    return opt_func

def make_learner(n_train=24, n_valid=8, bs=8, item_sleep=0., fwd_sleep=.001, step_sleep=0., cbs=None, metrics=None):
    dls = DataLoaders(TfmdDL(SleepyDS(n_train*bs, item_sleep), bs=bs, shuffle=True, num_workers=0),
                      TfmdDL(SleepyDS(n_valid*bs, item_sleep), bs=bs, num_workers=0))
    opt = slow_sgd(step_sleep) if step_sleep else SGD
    return Learner(dls, SleepyModel(fwd_sleep), loss_func=MSELossFlat(), opt_func=opt, lr=1e-2, cbs=cbs, metrics=metrics)

def profiled(learn, breakdown=False):
    learn.profile(breakdown=breakdown, show_report=False, logger_callback=None).fit(1)
    return learn.simple_profile.section('Diagnosis')

# ---- verdicts ----
def test_slow_loader_is_input_bound():
    d = profiled(make_learner(item_sleep=.001))
    assert isinstance(d, Diagnosis)
    assert d.verdict == 'input' and d.input_bound == 'highly'
    assert 'num_workers=' in d.knob and d.change['kind'] == 'num_workers' and d.change['value'] >= 1
    assert d.speedup_kind == 'model' and d.predicted_speedup > 1.3

def test_slow_loader_is_input_bound_with_prefetch_too():
    "With CudaPrefetchCallback the loader is drawn inside the batch (its `other`): still input, not callbacks"
    from fastprofile.prefetch import CudaPrefetchCallback, LoggingOps
    learn = make_learner(item_sleep=.001, cbs=CudaPrefetchCallback(ops=LoggingOps()))
    d = profiled(learn)
    assert learn.cuda_prefetch.active
    assert d.verdict == 'input' and d.input_bound == 'highly', d
    assert d.shares['callbacks'] < 10, d.shares
    staged = learn.cuda_prefetch.staging['train']
    assert staged[1] == 24 and staged[0] > 23*8*.001  # batches 2..24 drawn inside the one before, then the loader end
    rep = learn.simple_profile_report.plain()
    assert "shows in the batch's `other`" in rep
    kept = dict(learn.simple_profile.facts.staging)
    learn.validate()                                   # stages more batches: the fit's report keeps the fit's numbers
    assert learn.cuda_prefetch.staging['valid'][1] > kept['valid'].batches
    assert learn.simple_profile.facts.staging == kept and kept['train'] == tuple(staged)
    assert diagnose(learn).verdict == 'input'

def test_gpu_bound_is_compute_not_callbacks():
    "On a GPU the host waits for queued work where it syncs (the batch's `other`): the GPU spans say it is compute"
    from fastprofile.testing import FakeClock, FakeStream, FakeEvent, drive_gpu_batches
    from fastprofile.gpu_timing import GpuProfileRecord
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=4)
    rec.start_stage(); rec.start_epoch(0)
    drive_gpu_batches(rec, clock, fs, n=40, host=.0003)  # 0.3 ms launches per phase; 20+1+30 ms of GPU compute, 5.5 ms optimizer
    rec.end_epoch(); rec.end_stage(); rec.close()
    assert rec.stats[('train','batch_other')].mean > .040       # the wall clock alone puts the GPU time in `other`
    d = diagnose(rec)
    assert d.verdict == 'compute', d
    assert d.shares['callbacks'] < 5 and d.shares['compute'] > 75, d.shares
    assert 'GPU spans' in d.basis

def test_slow_model_is_compute_bound():
    d = profiled(make_learner(fwd_sleep=.008))
    assert d.verdict == 'compute' and 'to_fp16()' in d.knob
    assert d.input_bound != 'highly' and d.speedup_kind == 'bound'

def test_slow_optimizer():
    d = profiled(make_learner(step_sleep=.008))
    assert d.verdict == 'optimizer' and 'fused' in d.knob and 'batch size' in d.knob

def test_slow_callback_named_with_breakdown():
    d = profiled(make_learner(cbs=SleepyCallback(.008)), breakdown=True)
    assert d.verdict == 'callbacks'
    assert 'SleepyCallback.after_batch' in d.knob and 'remove_cb(SleepyCallback)' in d.knob
    assert d.change == dict(kind='remove_callback', name='SleepyCallback')

def test_slow_callback_without_breakdown_asks_for_one():
    d = profiled(make_learner(cbs=SleepyCallback(.008)))
    assert d.verdict == 'callbacks' and 'learn.profile(breakdown=True)' in d.knob and d.change is None
    assert 'not split' in d.basis

def test_slow_metric_named():
    learn = make_learner(n_valid=24, metrics=sleepy_metric)
    d = profiled(learn, breakdown=True)
    assert d.verdict == 'callbacks' and 'metric `sleepy_metric`' in d.knob and 'valid batch' in d.knob
    assert d.change == dict(kind='remove_metric', name='sleepy_metric')

def test_report_section_and_diagnose_agree():
    learn = make_learner(fwd_sleep=.004)
    d = profiled(learn)
    txt = learn.simple_profile_report.plain()
    assert 'Diagnosis:' in txt and 'Bound by: model compute' in txt
    d2 = diagnose(learn)
    assert d2.verdict == d.verdict and math.isclose(d2.predicted_speedup, d.predicted_speedup)
    assert learn.simple_profile.section('Diagnosis') is d  # the report's section is the Diagnosis itself
    assert diagnosis_section in SECTIONS

# ---- the advice, measured ----
@pytest.mark.parametrize('attempt', [0])
def test_more_workers_predicted_within_15pct(attempt):
    # 8 items x 2 ms = 16 ms of loading per batch, ~2 ms of model: two workers halve the loading
    learn = make_learner(n_train=30, n_valid=10, item_sleep=.002, fwd_sleep=.002)
    chk = _best_of(lambda: check_advice(learn, n_batches=25, n_valid=8))
    assert chk.change['kind'] == 'num_workers'
    assert chk.measured > 1.4, chk
    assert abs(chk.error) < .15, chk
    assert learn.dls.train.fake_l.num_workers == 0  # undone

def test_remove_slow_metric_predicted_within_15pct():
    # 5 ms of model per batch, 15 ms of metric per validation batch
    learn = make_learner(n_train=20, n_valid=20, fwd_sleep=.005, metrics=sleepy_metric)
    w0 = learn.model.a.item()
    chk = _best_of(lambda: check_advice(learn, n_batches=15))
    assert chk.change == dict(kind='remove_metric', name='sleepy_metric')
    assert chk.measured > 1.3, chk
    assert abs(chk.error) < .15, chk
    assert learn.model.a.item() == w0 and len(learn.metrics) == 1  # the learner is as it was

def test_check_advice_without_automatic_change():
    learn = make_learner(fwd_sleep=.006)
    chk = check_advice(learn, n_batches=6)
    assert chk.change is None and 'No automatic change' in repr(chk)
    with pytest.raises(ValueError, match="`resource` must be one of"): check_advice(learn, n_batches=4, resource='gpu')
    with pytest.raises(ValueError, match="n_batches"): check_advice(learn, n_batches=1)

def test_check_advice_for_another_resource():
    # compute-bound, but the metric's advice can be checked too
    learn = make_learner(n_train=10, n_valid=10, fwd_sleep=.02, metrics=sleepy_metric)
    chk = check_advice(learn, n_batches=8, resource='callbacks')
    assert chk.diagnosis.verdict == 'compute'
    assert chk.change == dict(kind='remove_metric', name='sleepy_metric') and chk.measured > 1.1

def _best_of(f, tries=2):
    "Run the measurement again once if it misses (a noisy 2-core machine); the second answer stands"
    chk = f()
    if abs(chk.error) >= .15 and tries > 1:
        warnings.warn(f"check_advice missed by {chk.error:+.0%} on the first try; measuring again")
        chk = f()
    return chk


# The breakdown's own tests (left-overs after an interrupt, a nested `validate()`, the synchronizing clock for a
# GPU loader) are in test_breakdown.py; check_advice leaving the learner as it was is in test_advice.py.
