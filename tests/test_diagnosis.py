"Scenarios with known bottlenecks, with and without loader workers: the right verdict and knob, a report that never contradicts itself, and predicted speedups that `check_advice` measures"
import math, os, re, subprocess, sys, textwrap, time, warnings
import pytest, torch
from torch import nn
from fastai.basics import *
from fastai.callback.all import *
from fastai.data.core import TfmdDL
from fasttransform import Transform, Pipeline
from fastprofile.learner import *
from fastprofile.analysis.sections import SECTIONS
from fastprofile.engine.core import Facts, LoadTime
from fastprofile.engine.tables import fmt_pct
from fastprofile.engine.rules import TIE
from fastprofile.engine.record import Row
from fastprofile.analysis.diagnosis import diagnose, Diagnosis, diagnosis_section
from fastprofile.engine.rules import MIN_GAIN
from fastprofile.engine.evidence import CATEGORIES
from fastprofile.fixes.advice import check_advice
from fastprofile.probes.breakdown import BreakdownProbe
from fastprofile.probes.callback_costs import CallbackCostsProbe
from fastprofile.probes.loading import _LOAD_KEY

class SleepyDS(torch.utils.data.Dataset):
    "A regression dataset whose items take `item_sleep` seconds each to load"
    def __init__(self, n, item_sleep=0.):
        self.x = torch.randn(n, 1); self.y = 2*self.x + 3 + .1*torch.randn(n, 1); self.item_sleep = item_sleep
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        if self.item_sleep: time.sleep(self.item_sleep)
        return self.x[i], self.y[i]

class SleepyModel(Module):
    "`y = a x + b`, sleeping `fwd_sleep` seconds in each forward of a batch of 8, in proportion for others: compute grows with the batch, as a model's does (a sleep per call would be per-batch work, which a larger batch pays once for more samples)"
    def __init__(self, fwd_sleep=0.):
        self.a,self.b,self.fwd_sleep = nn.Parameter(torch.randn(1)),nn.Parameter(torch.randn(1)),fwd_sleep
    def forward(self, x):
        if self.fwd_sleep: time.sleep(self.fwd_sleep*len(x)/8)
        return x*self.a + self.b

class SleepyCallback(Callback):
    "Sleeps after every batch, like a slow logger"
    def __init__(self, s=.005): self.s = s
    def after_batch(self): time.sleep(self.s)

class BusyCallback(Callback):
    "Computes for `s` seconds after every batch (a busy wait), like a slow callback that works rather than waits: no sleep's wake-up, which on a loaded machine costs the next batch too"
    def __init__(self, s=.005): self.s = s
    def after_batch(self):
        end = time.perf_counter() + self.s
        while time.perf_counter() < end: pass

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

class SleepyBatchTfm(Transform):
    "A batch transform that sleeps `s` seconds per batch, in the main process (fastai runs `after_batch` there)"
    s = .025
    def __call__(self, b, **kwargs): time.sleep(self.s); return b

def make_learner(n_train=24, n_valid=8, bs=8, item_sleep=0., fwd_sleep=.001, step_sleep=0., cbs=None, metrics=None, workers=0,
                 after_batch=None):
    dls = DataLoaders(TfmdDL(SleepyDS(n_train*bs, item_sleep), bs=bs, shuffle=True, num_workers=workers, after_batch=after_batch),
                      TfmdDL(SleepyDS(n_valid*bs, item_sleep), bs=bs, num_workers=workers, after_batch=after_batch))
    opt = slow_sgd(step_sleep) if step_sleep else SGD
    learn = Learner(dls, SleepyModel(fwd_sleep), loss_func=MSELossFlat(), opt_func=opt, lr=1e-2, cbs=cbs, metrics=metrics)
    learn.remove_cb(ProgressCallback)
    return learn

def profiled(learn, breakdown=False):
    learn.profile(breakdown=breakdown, show_report=False, logger_callback=None).fit(1)
    return learn.simple_profile.section('Diagnosis')

def check_consistent(d:Diagnosis):
    """Every line agrees with the verdict's and reads at a glance: a busy machine first, one headline of at most 100 characters with the
    verdict's share, the first fix as code with its speedup, at most three more, in their rank; no fix under 5%; nothing said twice"""
    lines = d.lines()
    if d.preface: assert lines[0] == d.preface and lines[0].startswith('Busy machine'); lines = lines[1:]
    assert lines[0] == d.head and lines[0].startswith(f"Bound by {d.bound.label}: {fmt_pct(d.bound.share)} of the fit"), lines
    assert all(d.bound.saved >= f.saved for f in d.findings)  # what bounds the run: the largest saving if it cost nothing
    assert len(lines[0]) <= 100 and all(len(l) <= 160 for l in lines) and len(set(lines)) == len(lines), lines
    assert not any(l.startswith('Bound by') for l in lines[1:]), lines
    assert all('input-bound' not in l for l in lines[1:]), lines
    if 'input-bound' in lines[0]: assert d.verdict == 'input', lines
    fixes = [f for f in d.findings if f.offered]
    assert not fixes or d.first is fixes[0] and all(d.first.weight*TIE >= f.weight for f in fixes)  # the first weighs most, or ties
    assert [f.weight for f in fixes[len(d.lead):]] == sorted((f.weight for f in fixes[len(d.lead):]), reverse=True)  # the rest ranked
    for l in lines:
        for x in re.findall(r'(\d+\.\d+)x predicted|at most (\d+\.\d+)x', l): assert float(x[0] or x[1]) >= MIN_GAIN, l
    if d.knob:
        assert d.predicted_speedup >= MIN_GAIN and lines[1] in (f"Fix: {d.first.short()}", f"Fix ({d.first.label}): {d.first.short()}"), lines
        assert lines[1].startswith('Fix: ') == (d.first.resource == d.bound.resource), lines  # a fix for another resource says which
        if d.speedup_kind == 'model': assert '`' in lines[1], lines  # a predicted fix is code to paste (a ceiling may be advice)
        assert d.knob in '\n'.join(d.evidence())
    else: assert lines[1].startswith('Fix: no change'), lines
    assert len(lines) <= 2 + 3 and all(l.startswith(('Then: ', 'Or (a tie): ')) for l in lines[2:]), lines
    ev = d.evidence()
    k = len(d.details)  # the costliest layers, tokens/s: between the shares and the basis
    assert ev[-1].startswith('Rests on:') and ev[-2-k].startswith('Main-process time') and ev[-1-k:-1] == d.details

# ---- known bottlenecks, with no workers and with two ----
SCENARIOS = {
    'input': dict(item_sleep=.002, fwd_sleep=.001),
    'compute': dict(fwd_sleep=.008),
    'optimizer': dict(step_sleep=.008),
    # a callback or metric costs per batch: a larger batch `k` times as large pays it once for `k` times the samples, which
    # saves (1 - 1/k) of what removing it saves, and more of the rest; the training set holds 4 batches of twice the size at most
    # (`n_train=12`), so removing the callback or metric is the clear first fix (a 2 ms forward and an 8 ms callback at 4x tie)
    'metric': dict(fwd_sleep=.004, metrics=sleepy_metric, n_valid=32, n_train=12),
    'callback': dict(fwd_sleep=.006, cbs='sleepy', n_train=12),
}

@pytest.mark.parametrize('workers', [0, 2])
@pytest.mark.parametrize('name', list(SCENARIOS))
def test_known_bottleneck(name, workers):
    kw = dict(SCENARIOS[name])
    if kw.get('cbs') == 'sleepy': kw['cbs'] = SleepyCallback(.008)
    d = profiled(make_learner(workers=workers, **kw))
    assert isinstance(d, Diagnosis)
    check_consistent(d)
    expect = {'input':'input', 'compute':'compute', 'optimizer':'optimizer', 'metric':'callbacks', 'callback':'callbacks'}[name]
    if name == 'optimizer' and d.verdict == 'per_batch':  # an optimizer step is per-batch work: a larger batch pays it once for more samples
        assert d.change['kind'] == 'batch_size' and d.speedup_kind == 'model' and any(f.resource == 'optimizer' for f in d.findings), d
        return
    assert d.verdict == expect, d
    if name == 'input':
        assert 'num_workers=' in d.knob, d
        if workers < d.numbers['cpus']:
            assert d.change['kind'] == 'num_workers' and d.change['value'] > workers, d
            assert d.speedup_kind == 'model' and d.predicted_speedup > 1.3, d
        else:  # as many workers as CPUs: cheaper items, and (they sleep) more workers than CPUs, not predicted
            assert 'cheaper to load' in d.knob and 'Its workers mostly wait' in d.knob and d.change is None, d
        if workers: assert d.first.detail.endswith('the workers set the pace'), d
        else: assert d.input_bound == 'highly' and 'highly input-bound' in d.statement
    elif name == 'compute':
        assert 'to_fp16()' in d.knob and 'torch.compile' in d.knob and d.speedup_kind == 'bound', d
        assert d.predicted_speedup > 1.5, d  # with workers too: the old model said 1.00x
    elif name == 'optimizer': assert 'fused' in d.knob and 'batch size' in d.knob, d
    elif name == 'metric':
        assert 'metric `sleepy_metric` costs' in d.knob and 'per validation batch' in d.knob, d
        assert d.change == dict(kind='remove_metric', name='sleepy_metric') and d.speedup_kind == 'model', d
    else:
        assert '`SleepyCallback` costs' in d.knob and 'SleepyCallback.after_batch' in d.knob and 'remove_cb(SleepyCallback)' in d.knob, d
        assert d.change == dict(kind='remove_callback', name='SleepyCallback') and d.speedup_kind == 'model', d
    if workers: assert f"{workers} loader workers (each batch built in" in d.basis and 'timed in the workers' in d.basis, d.basis

def test_the_issue_reproducer_with_workers():
    "A 2-conv net on random images, `num_workers=2`: compute bounds it, and its bound is not 1.00x (the old model's answer)"
    class DS(torch.utils.data.Dataset):
        def __init__(self, n): self.x,self.y = torch.randn(n, 3, 32, 32),torch.randint(0, 10, (n,))
        def __len__(self): return len(self.x)
        def __getitem__(self, i): return self.x[i],self.y[i]
    dls = DataLoaders.from_dsets(DS(64*8), DS(64*2), bs=64, num_workers=2)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat())
    learn.remove_cb(ProgressCallback)
    d = profiled(learn)
    check_consistent(d)
    assert d.verdict == 'compute' and d.predicted_speedup > 2, d
    assert '1.00x' not in repr(d)
    assert 'channels_last' in d.knob  # a conv net on the CPU

def test_slow_loader_is_input_bound_with_prefetch_too():
    "With CudaPrefetchCallback the loader is drawn inside the batch (its `other`): still input, not callbacks"
    from fastprofile.data.prefetch import CudaPrefetchCallback, LoggingOps
    learn = make_learner(item_sleep=.001, cbs=CudaPrefetchCallback(ops=LoggingOps()))
    d = profiled(learn)
    assert learn.cuda_prefetch.active
    assert d.verdict == 'input' and d.input_bound == 'highly', d
    assert d.shares['callbacks'] < 10, d.shares
    check_consistent(d)
    staged = learn.cuda_prefetch.staging['train']
    assert staged[1] == 24 and staged[0] > 23*8*.001  # batches 2..24 drawn inside the one before, then the loader end
    assert "shows in the batch's `other`" in ' '.join(learn.simple_profile_report.plain(width=1000).split())
    kept = dict(learn.simple_profile.facts.staging)
    learn.validate()                                   # stages more batches: the fit's report keeps the fit's numbers
    assert learn.cuda_prefetch.staging['valid'][1] > kept['valid'].batches
    assert learn.simple_profile.facts.staging == kept and kept['train'] == tuple(staged)
    assert diagnose(learn).verdict == 'input'

def test_gpu_bound_is_compute_not_callbacks():
    "On a GPU the host waits for queued work where it syncs (the batch's `other`): the GPU spans say it is compute (fakes: no GPU here)"
    from fastprofile.testing import FakeClock, FakeStream, FakeEvent, drive_gpu_batches
    from fastprofile.engine.gpu_timing import GpuProfileRecord
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=4)
    rec.before_fit(); rec.before_epoch(0)
    drive_gpu_batches(rec, clock, fs, n=40, host=.0003)  # 0.3 ms launches per phase; 20+1+30 ms of GPU compute, 5.5 ms optimizer
    rec.after_epoch(); rec.after_fit(); rec.close()
    assert rec.stats[Row('train','batch','other')].mean > .040       # the wall clock alone puts the GPU time in `other`
    d = diagnose(rec, Facts(device='cuda:0', num_workers=4, loading={'train':LoadTime(.02, .018, 40, 4)}))
    assert d.verdict == 'compute' and 'to_fp16()' in d.knob, d
    assert d.shares['callbacks'] < 5 and d.shares['compute'] > 75, d.shares
    assert 'GPU spans' in d.basis
    assert d.predicted_speedup > 5  # the workers (5 ms a batch) keep up: compute is what bounds the step
    check_consistent(d)

def test_a_loader_that_sets_the_pace_outranks_compute():
    "With workers slower than the main process, faster compute saves nothing: the loader is the verdict though compute takes more time"
    from fastprofile.testing import FakeClock, drive_record
    from fastprofile.engine.record import ProfileRecord
    clock = FakeClock()
    rec = drive_record(ProfileRecord(warmup=0, clock=clock), clock, n_train=20, n_valid=0,
                       cost=dict(draw=.02, forward=.03, gap=0, loss=0, backward=0, opt_step=0, zero_grad=0))
    d = diagnose(rec, Facts(num_workers=2, loading={'train':LoadTime(.1, .09, 40, 2)}, cpus=8))
    assert d.shares['compute'] > d.shares['input']
    assert d.verdict == 'input' and d.change == dict(kind='num_workers', value=4, before=2), d
    assert not any(f.resource == 'compute' and f.fix for f in d.findings if f.speedup >= MIN_GAIN)  # nothing to gain there
    check_consistent(d)

def test_cpu_advice_threads_and_batch_size():
    "On a CPU: fewer threads than cores is measured and predicted; the GPU is one line among the options"
    from fastprofile.testing import FakeClock, drive_record
    from fastprofile.engine.record import ProfileRecord
    clock = FakeClock()
    rec = drive_record(ProfileRecord(warmup=0, clock=clock), clock, n_train=20, n_valid=0,
                       cost=dict(draw=.001, forward=.04, backward=.04, opt_step=.01, gap=0, loss=0, zero_grad=0))
    d = diagnose(rec, Facts(num_workers=0, threads=1, cpus=4, batch_size=32, model=dict(conv2d=True)))
    assert d.verdict == 'compute' and 'torch.set_num_threads(4)' in d.knob and 'torch uses 1 of 4 cores' in d.knob, d
    assert 'channels_last' in d.knob and 'torch.compile' in d.knob and d.knob.count('GPU') == 1, d
    assert 'a larger batch size (now 32)' in d.knob, d
    test_s = .091/(.001 + .01 + .08/4)  # compute on 4 threads: at most a quarter of the time
    assert math.isclose(d.predicted_speedup, test_s, rel_tol=1e-6), (d.predicted_speedup, test_s)
    d2 = diagnose(rec, Facts(num_workers=0, threads=4, cpus=4, model=dict(conv2d=True, channels_last=True, compiled=True)))
    assert 'set_num_threads' not in d2.knob and 'channels_last' not in d2.knob and 'torch.compile' not in d2.knob
    assert d2.first.if_free and 'if it cost nothing' in '\n'.join(d2.evidence())

def test_report_section_and_diagnose_agree():
    learn = make_learner(fwd_sleep=.004)
    d = profiled(learn)
    txt = learn.simple_profile_report.plain()
    assert 'Diagnosis:' in txt and 'Bound by model compute' in txt
    d2 = diagnose(learn)
    assert d2.verdict == d.verdict and math.isclose(d2.predicted_speedup, d.predicted_speedup)
    assert learn.simple_profile.section('Diagnosis') is d  # the report's section is the Diagnosis itself
    assert diagnosis_section in SECTIONS

def test_breakdown_names_them_too():
    "With `breakdown=True` every batch is timed (no sampling), and the same callback is named"
    d = profiled(make_learner(cbs=SleepyCallback(.008)), breakdown=True)
    assert d.verdict == 'callbacks' and '`SleepyCallback` costs' in d.knob and d.change == dict(kind='remove_callback', name='SleepyCallback')
    assert 'the breakdown split `draw`' in d.basis

# ---- the pipeline model on measured runs, 0, 1 and 2 workers ----
@pytest.mark.parametrize('workers', [0, 1, 2])
def test_pipeline_model_on_measured_runs(workers):
    "The loader is timed where it builds (8 items x 3 ms), the model reproduces the measured step, and says who sets the pace"
    learn = make_learner(n_train=24, item_sleep=.003, fwd_sleep=.004, workers=workers)
    d = profiled(learn)
    lt = learn.simple_profile.facts.loading['train']
    assert lt.workers == workers and 8*.003 <= lt.seconds < 8*.003*3 and lt.cpu_seconds < .5*lt.seconds, lt  # a sleep: no CPU
    ph = d.numbers['phases']['train']
    rec = learn.simple_profile_record
    measured = rec.stats[Row('train','draw')].mean + rec.stats[Row('train','batch')].mean
    assert math.isclose(ph['step'], measured, rel_tol=1e-6)
    assert ph['load_timed'] and ph['loader_bound'] == (workers > 0)  # 24 ms of loading over 1 or 2 workers > ~6 ms of main
    if workers: assert math.isclose(ph['load'], workers*ph['step'])  # loader-bound: the workers' pace is the step

def _within(f, tol=.15):
    "Measure twice if the first try misses (a noisy 2-core machine); both tries are in the message if both miss"
    a = f()
    if abs(a.error) < tol: return a
    warnings.warn(f"check_advice missed by {a.error:+.0%} on the first try; measuring again")
    b = f()
    assert abs(b.error) < tol, f"prediction off by more than {tol:.0%} twice:\n1st: {a}\n2nd: {b}"
    return b

@pytest.mark.parametrize('workers', [0, 1])
def test_more_workers_predicted_within_15pct(workers):
    # 8 items x 3 ms = 24 ms of loading per batch, ~3 ms of main process: one worker per CPU from none (two here);
    # from one worker (timed: it mostly sleeps), up to twice the CPUs. The loader still sets the pace after the change.
    # (Near the balance, where the main process would set it, the cost of taking each batch from a worker decides,
    # which on this loaded two-core machine varies from 0.3 to 2 ms a batch: see the notebook.)
    learn = make_learner(n_train=30, n_valid=10, item_sleep=.003, fwd_sleep=.002, workers=workers)
    chk = _within(lambda: check_advice(learn, n_batches=25, n_valid=8))
    assert chk.change['kind'] == 'num_workers' and chk.change['value'] > workers
    assert chk.measured > 1.4, chk
    assert learn.dls.train.fake_l.num_workers == workers  # undone

# With workers, taking each batch from them costs the main process 1-5 ms a batch on this loaded two-core machine,
# varying from window to window (draws of 30 ms now and then): with workers the model here is slower, so that this
# noise stays within the tolerance
@pytest.mark.parametrize('workers', [0, 2])
def test_remove_slow_metric_predicted_within_15pct(workers):
    # 8 ms of model per batch (15 ms with workers), 15 ms of metric per validation batch
    learn = make_learner(n_train=25, n_valid=25, fwd_sleep=.015 if workers else .008, metrics=sleepy_metric, workers=workers)
    w0 = learn.model.a.item()
    chk = _within(lambda: check_advice(learn, n_batches=20, resource='callbacks'))  # the verdict may be compute: 8 ms a batch
    assert chk.change == dict(kind='remove_metric', name='sleepy_metric')
    assert chk.measured > 1.3, chk
    assert learn.model.a.item() == w0 and len(learn.metrics) == 1  # the learner is as it was

@pytest.mark.parametrize('workers', [0, 2])
def test_remove_slow_callback_predicted_within_15pct(workers):
    # the callback computes (a sleeping one also costs its wake-up, on a loaded machine up to 2 ms a batch of the next
    # steps, which no sample of the callback sees: removing it then gains more than predicted, 2.35x for 2.04x)
    learn = make_learner(n_train=25, n_valid=25, fwd_sleep=.02 if workers else .006, cbs=BusyCallback(.01), workers=workers)
    chk = _within(lambda: check_advice(learn, n_batches=20, resource='callbacks'))
    assert chk.change == dict(kind='remove_callback', name='BusyCallback')
    assert chk.measured > 1.3, chk
    assert any(isinstance(cb, BusyCallback) for cb in learn.cbs)

# ---- main-process input: a slow `after_batch` transform (the wait is not the loader's build time) ----
@pytest.mark.parametrize('workers', [0, 2])
def test_slow_after_batch_named_and_moving_it_predicted_within_15pct(workers):
    "25 ms of `after_batch` per batch, a loader that builds a batch in well under 1 ms: the transform is named, and moving it into the workers predicted"
    learn = make_learner(n_train=60, n_valid=10, fwd_sleep=.001, after_batch=[SleepyBatchTfm()], workers=workers)
    d = profiled(learn)
    check_consistent(d)
    costs = learn.simple_profile.facts.callback_costs
    assert dict(costs.drawn) == dict(costs.batches)  # split on the sampled batches only
    assert .025 <= costs.draw_parts('train')['SleepyBatchTfm'] < .1
    assert d.verdict == 'batch_tfms' and '`SleepyBatchTfm`' in d.statement and 'in the main process' in d.statement, d
    assert 'no change is predicted' not in repr(d) and d.speedup_kind == 'model' and d.predicted_speedup > 1.4, d
    assert d.change['kind'] == 'move_tfm' and d.change['name'] == 'SleepyBatchTfm' and d.change['workers'] >= max(workers, 1), d
    assert 'item_tfms' in d.knob and 'before_batch' in d.knob
    pipes = [dl.after_batch for dl in learn.dls.loaders]
    # long windows: the workers fill their queue ahead while a phase starts (its warm-up batch), so a short window
    # measures faster than their steady pace, which the model predicts (25 batches: 14% faster; 50: within 5%)
    chk = _within(lambda: check_advice(learn, n_batches=50, n_valid=5, resource='batch_tfms'))
    assert chk.change['kind'] == 'move_tfm' and chk.measured > 1.4, chk
    # undone: the same pipelines with the transform in them, no `create_batch` of ours, the workers as they were
    assert [dl.after_batch for dl in learn.dls.loaders] == pipes and all(isinstance(p.fs[0], SleepyBatchTfm) for p in pipes)
    assert not any('create_batch' in dl.__dict__ for dl in learn.dls.loaders)
    assert learn.dls.train.fake_l.num_workers == workers

def test_check_advice_without_automatic_change():
    learn = make_learner(fwd_sleep=.006)
    chk = check_advice(learn, n_batches=6)
    assert chk.change is None and 'No automatic change' in repr(chk)
    with pytest.raises(ValueError, match="`resource` must be one of"): check_advice(learn, n_batches=4, resource='gpu')
    with pytest.raises(ValueError, match="n_batches"): check_advice(learn, n_batches=1)

def test_check_advice_for_another_resource():
    # bound by compute (a ceiling), the metric's advice (predicted) checked by name: the fix known to pay leads, and the
    # headline still says what bounds the run
    learn = make_learner(n_train=10, n_valid=10, fwd_sleep=.02, metrics=sleepy_metric)
    chk = check_advice(learn, n_batches=8, resource='callbacks')
    assert chk.diagnosis.bound.resource == 'compute', chk.diagnosis
    assert chk.change == dict(kind='remove_metric', name='sleepy_metric') and chk.measured > 1.1

# ---- the sampler and the loader timing: nothing left behind, nothing changed ----
def _losses(workers, profile):
    set_seed(5, reproducible=True)
    learn = make_learner(n_train=6, n_valid=3, fwd_sleep=0., metrics=mae, cbs=SleepyCallback(0.), workers=workers)
    if profile: learn.profile(show_report=False, logger_callback=None)
    learn.fit(2, 1e-2)
    return [float(v) for v in L(learn.recorder.losses)] + [float(v) for v in learn.recorder.values[-1]],learn

@pytest.mark.parametrize('workers', [0, 2])
def test_sampler_never_changes_training_and_leaves_nothing(workers):
    a,_ = _losses(workers, False)
    b,learn = _losses(workers, True)
    assert a == b
    f = learn.simple_profile.facts
    assert f.callback_costs.batches['train'] > 0 and set(f.loading) == {'train','valid'}
    assert not any(k in cb.__dict__ for cb in learn.cbs for k in list(type(cb).__dict__) if k.startswith(('before_','after_')))
    assert not any('accumulate' in m.__dict__ for m in learn.metrics)
    for dl in learn.dls.loaders: assert _LOAD_KEY not in dl.__dict__ and 'create_batches' not in dl.__dict__

@pytest.mark.parametrize('where', ['callback', 'interrupt'])
def test_sampler_restored_on_every_exit_path(where):
    class Boom(Callback):
        def after_batch(self):
            if self.training and self.iter == 3: raise (RuntimeError('boom') if where == 'callback' else KeyboardInterrupt())
    learn = make_learner(cbs=[SleepyCallback(0.), Boom()], metrics=mae, workers=2)
    learn.profile(show_report=False, logger_callback=None)
    with pytest.raises(RuntimeError if where == 'callback' else KeyboardInterrupt): learn.fit(1)
    assert not any(e in cb.__dict__ for cb in learn.cbs for e in ('after_batch','before_batch','after_epoch','after_validate'))
    assert not any('accumulate' in m.__dict__ for m in learn.metrics)
    for dl in learn.dls.loaders: assert _LOAD_KEY not in dl.__dict__ and 'create_batches' not in dl.__dict__
    learn.remove_cb(Boom); learn.fit(1)  # a plain fit works

def test_sampler_schedule_and_a_callback_that_sets_its_own_method():
    "Warm-up 1, then batches 1-3 (at most one in 16 of a phase's batches past the warm-up, at least one), then every 32nd; a callback's own instance attribute survives"
    own = lambda: None
    class SetsItsOwn(Callback):
        def after_epoch(self): self.__dict__['after_train'] = own
    learn = make_learner(n_train=60, n_valid=5, fwd_sleep=0., cbs=[SleepyCallback(0.), SetsItsOwn()])
    learn.profile(show_report=False, logger_callback=None).fit(2)
    c = learn.simple_profile.facts.callback_costs
    assert c.batches['train'] == 2*4 and c.batches['valid'] == 2*1  # train: batches 1, 2, 3, 33; valid (4 past the warm-up): 1
    short = make_learner(n_train=20, n_valid=2, fwd_sleep=0., cbs=SleepyCallback(0.))  # 19 batches past the warm-up: one sampled
    short.profile(show_report=False, logger_callback=None).fit(1)
    assert short.simple_profile.facts.callback_costs.batches == {'train': 1, 'valid': 1}
    df = c.callback_costs()
    assert len(df[(df.name == 'SleepyCallback') & (df.event == 'after_batch') & (df.phase == 'train')]) == 1
    assert len(df[(df.phase == 'fit') & (df.name == 'Recorder') & (df.event == 'after_epoch')]) == 1  # between batches: every call
    assert learn.sets_its_own.__dict__['after_train'] is own

def test_sampler_follows_the_callbacks_from_call_to_call():
    "The sampler works out which event methods to time once per learner, again whenever its callbacks, its metrics, a callback's own methods or its class's change"
    class Extra(Callback):
        def after_batch(self): pass
    learn = make_learner(n_train=6, n_valid=2, fwd_sleep=0., cbs=SleepyCallback(0.))
    def timed():
        learn.profile(show_report=False, logger_callback=None).fit(1)
        return {(r[1], r[2]) for r in learn.simple_profile.facts.callback_costs.rows()}
    first = timed()
    assert ('SleepyCallback','after_batch') in first and ('Extra','after_batch') not in first
    assert timed() == first  # the same callbacks: the same methods
    learn.add_cb(Extra())
    assert ('Extra','after_batch') in timed()
    sleepy = next(cb for cb in learn.cbs if type(cb).__name__ == 'SleepyCallback')
    sleepy.after_pred = lambda: None  # a method set on an instance
    assert ('SleepyCallback','after_pred') in timed()
    learn.remove_cb(Extra); del sleepy.after_pred
    assert timed() == first
    learn.metrics = [mae]
    assert ('metric mae','accumulate') in timed()
    type(sleepy).before_draw = lambda self: None  # a method added to the callback's class between calls (fastcore's `@patch` does this)
    try: assert ('SleepyCallback','before_draw') in timed()
    finally: del type(sleepy).before_draw

def test_a_cancelled_step_is_a_batch_event():
    "`after_cancel_step` fires inside a batch: timed on sampled batches only, never wrapped for the whole call"
    class SkipsSteps(Callback):
        def before_step(self): raise CancelStepException()
        def after_cancel_step(self): time.sleep(.002)
    learn = make_learner(n_train=12, n_valid=2, fwd_sleep=0., cbs=SkipsSteps())
    learn.profile(show_report=False, logger_callback=None).fit(1)
    df = learn.simple_profile.facts.callback_costs.callback_costs()
    row = df[(df.name == 'SkipsSteps') & (df.event == 'after_cancel_step')]
    assert list(row.phase) == ['train'] and row.per_batch.iloc[0] >= .002, row
    assert 'after_cancel_step' not in learn.skips_steps.__dict__

def test_a_breakdown_added_by_hand_is_not_timed_twice():
    learn = make_learner(cbs=[SleepyCallback(.004), BreakdownProbe()])
    learn.profile(show_report=False, logger_callback=None).fit(1)
    bd = learn.breakdown.result.callback_costs()
    sampled = learn.simple_profile.facts.callback_costs.callback_costs()
    assert len(bd[bd.name == 'SleepyCallback']) and not len(sampled[sampled.name == 'SleepyCallback'])

SPAWN = textwrap.dedent('''
    import multiprocessing, sys, torch
    from fastai.basics import *
    from fastai.data.core import TfmdDL
    from fastai.test_utils import RegModel
    import fastprofile.learner
    from fastprofile.analysis.diagnosis import diagnose
    if __name__ == '__main__':
        multiprocessing.set_start_method(sys.argv[1], force=True)
        ds = [(torch.randn(1), torch.randn(1)) for _ in range(64)]
        dls = DataLoaders(TfmdDL(ds, bs=8, num_workers=1, persistent_workers=sys.argv[1] == 'fork'), TfmdDL(ds[:16], bs=8), device='cpu')
        learn = Learner(dls, RegModel(), loss_func=MSELossFlat())
        learn.profile(show_report=False, logger_callback=None).fit(2)
        print('loading', sorted(learn.simple_profile.facts.loading), diagnose(learn).verdict)
        assert '_fastprofile_load' not in dls.train.__dict__ and 'create_batches' not in dls.train.__dict__
        learn.fit(1)
''')

@pytest.mark.parametrize('method', ['spawn', 'fork'])
def test_workers_started_by_spawn_or_persistent(tmp_path, method):
    "With `spawn` the workers build untimed (the loader is still restored); persistent workers keep being timed over epochs"
    script = tmp_path/'spawn.py'; script.write_text(SPAWN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get('PYTHONPATH', '')]))
    r = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = [l for l in r.stdout.splitlines() if l.startswith('loading')][0]
    assert ("'train'" in out) == (method == 'fork'), out  # spawn: the train loader's workers were not timed

# ---- the prediction errors, measured repeatedly: `PYTHONPATH=$PWD python tests/test_diagnosis.py 5` ----
ACCURACY = {  # name -> (learner, check_advice's arguments)
    'workers 0->': (lambda: make_learner(n_train=30, n_valid=10, item_sleep=.003, fwd_sleep=.002), dict(n_batches=25, n_valid=8)),
    'workers 1->': (lambda: make_learner(n_train=30, n_valid=10, item_sleep=.003, fwd_sleep=.002, workers=1), dict(n_batches=25, n_valid=8)),
    'metric W=0': (lambda: make_learner(n_train=25, n_valid=25, fwd_sleep=.008, metrics=sleepy_metric), dict(n_batches=20, resource='callbacks')),
    'metric W=2': (lambda: make_learner(n_train=25, n_valid=25, fwd_sleep=.015, metrics=sleepy_metric, workers=2), dict(n_batches=20, resource='callbacks')),
    'callback W=0': (lambda: make_learner(n_train=25, n_valid=25, fwd_sleep=.006, cbs=SleepyCallback(.01)), dict(n_batches=20, resource='callbacks')),
    'callback W=2': (lambda: make_learner(n_train=25, n_valid=25, fwd_sleep=.02, cbs=SleepyCallback(.01), workers=2), dict(n_batches=20, resource='callbacks')),
    'after_batch W=0': (lambda: make_learner(n_train=60, n_valid=10, after_batch=[SleepyBatchTfm()]), dict(n_batches=50, n_valid=5, resource='batch_tfms')),
    'after_batch W=2': (lambda: make_learner(n_train=60, n_valid=10, after_batch=[SleepyBatchTfm()], workers=2), dict(n_batches=50, n_valid=5, resource='batch_tfms')),
}

if __name__ == '__main__':
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for name,(mk,kw) in ACCURACY.items():
        errs = []
        for _ in range(n):
            chk = check_advice(mk(), **kw)
            errs.append(chk.error)
            print(f"{name:13s} {chk.change}: predicted {chk.predicted:.2f}x, measured {chk.measured:.2f}x, error {chk.error:+.1%}", flush=True)
        e = np.array(errs)
        print(f"{name:13s} mean {e.mean():+.1%}, sd {e.std():.1%}, worst {e[np.abs(e).argmax()]:+.1%}, within 15%: {(np.abs(e) < .15).sum()}/{n}\n", flush=True)

def test_a_ceiling_does_not_lead_a_measured_fix():
    """A loader of 35 ms a batch beside a 50 ms model: compute free would give 2.4x at most (a ceiling), two workers 1.7x (predicted by
    the pipeline model). The ranking weighs a ceiling at half the time it bounds: the predicted fix leads, the ceiling follows"""
    d = profiled(make_learner(item_sleep=.0044, fwd_sleep=.05, n_train=12, n_valid=4))
    check_consistent(d)
    comp = next(f for f in d.findings if f.resource == 'compute')
    assert comp.kind == 'bound' and comp.speedup > 1.2*d.predicted_speedup, d  # premise: the ceiling is the larger speedup
    assert d.verdict == 'input' and d.change['kind'] == 'num_workers' and d.speedup_kind == 'model', d
    assert d.lines()[-1].startswith(('Then: a cheaper model', 'Or (a tie): a cheaper model')), d.lines()
