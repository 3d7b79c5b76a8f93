"GPU-true timings: mode selection on CPU; on a CUDA GPU, events recover known GPU costs within 5% of sync"
import math, time, pytest, torch
from torch import nn
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.record import FakeClock
from fastprofile.gpu_timing import GpuProfileRecord, FakeStream, FakeEvent, drive_gpu_batches, gpu_notes

def test_auto_is_wall_on_cpu():
    learn = synth_learner(n_trn=4, n_val=2)
    learn.profile(show_report=False, logger_callback=None).fit(1)
    rec = learn.simple_profile_record
    assert rec.timing == 'wall' and not isinstance(rec, GpuProfileRecord)
    assert 'GPU Mean Duration' not in learn.simple_profile_results
    assert 'Timing: wall clock (time.perf_counter)' in learn.simple_profile_report.plain()

def test_report_layout_with_both_clocks():
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=3)
    rec.timing = 'events'
    rec.start_fit(); rec.start_epoch(0); drive_gpu_batches(rec, clock, fs, n=12); rec.end_epoch(); rec.end_fit()
    rep = make_report(rec)
    f = rep.formatted()
    assert f.columns[-2:].tolist() == ['GPU Mean Duration','GPU Total Time']
    row = f[(rep.results.Action=='batch') & (rep.results.Step=='backward')].iloc[0]
    assert row['GPU Mean Duration'] == '30.00 ms' and row['Mean Duration'] == '1.00 ms'
    txt = rep.plain()
    assert 'CUDA events' in txt and 'GPU idle:' in txt and 'mostly the backward pass' in txt

def test_pool_is_bounded_and_resolves_everything():
    clock = FakeClock(); fs = FakeStream(clock); made = []
    def mk(): e = FakeEvent(fs); made.append(e); return e
    rec = GpuProfileRecord(make_event=mk, clock=clock, pool_batches=5, warmup=0, fold_every=7)
    rec.start_fit(); rec.start_epoch(0); drive_gpu_batches(rec, clock, fs, n=300); rec.end_epoch(); rec.end_fit()
    assert len(made) == 5*13
    assert rec.gpu_stats[('train','backward')].n == 300
    assert abs(rec.gpu_stats[('train','backward')].mean - 0.030) < 1e-9
    r = rec.recent()
    assert 'backward_gpu' in r and abs(r.backward_gpu.iloc[-1] - 0.030) < 1e-9

# ---- on a GPU ----
def _known_cost_learner(cycles):
    "A learner whose forward, backward and optimizer step each spin the GPU for a known number of cycles"
    class Spin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): torch.cuda._sleep(cycles['forward']); return x.clone()
        @staticmethod
        def backward(ctx, g): torch.cuda._sleep(cycles['backward']); return g
    class M(nn.Module):
        def __init__(self): super().__init__(); self.lin = nn.Linear(1, 1)
        def forward(self, x): return self.lin(Spin.apply(x))
    class SpinOpt(OptimWrapper):
        def step(self): torch.cuda._sleep(cycles['opt_step']); self.opt.step()
    learn = synth_learner(n_trn=40, n_val=4, cuda=True)
    learn.model = M().cuda()
    learn.opt_func = lambda params, lr: SpinOpt(params, torch.optim.SGD, lr=lr)
    return learn

@pytest.mark.cuda
def test_events_match_sync_and_wall_misattributes():
    torch.cuda.init()
    # calibrate: cycles per ms on this GPU
    s,e = torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
    s.record(); torch.cuda._sleep(10_000_000); e.record(); torch.cuda.synchronize()
    per_ms = 10_000_000/s.elapsed_time(e)
    want = dict(forward=4., backward=8., opt_step=2.)  # ms
    cycles = {k:int(v*per_ms) for k,v in want.items()}
    res = {}
    for mode in ('sync','events','wall'):
        learn = _known_cost_learner(cycles)
        learn.profile(timing=mode, show_report=False, logger_callback=None).fit(1)
        res[mode] = learn.simple_profile_results.set_index(['Phase','Action','Step'])
    for k,ms in want.items():
        sync = res['sync'].loc[('train','batch',k),'Mean Duration']
        ev = res['events'].loc[('train','batch',k),'GPU Mean Duration']
        assert abs(ev - sync) <= 0.05*sync, (k, ev, sync)
        assert abs(ev*1e3 - ms) <= 0.1*ms, (k, ev, ms)
    # wall alone charges queued GPU work to a later phase: backward's wall time is far below its GPU time
    assert res['wall'].loc[('train','batch','backward'),'Mean Duration'] < 0.5*want['backward']/1e3

@pytest.mark.cuda
def test_events_overhead_under_one_percent():
    "The events' own cost per batch (self-measured at fit start) is under 1% of a mean training step"
    learn = _known_cost_learner(dict(forward=2_000_000, backward=4_000_000, opt_step=1_000_000))
    learn.profile(timing='events', show_report=False, logger_callback=None).fit(1)
    rec = learn.simple_profile_record
    step = rec.stats[('train','draw')].mean + rec.stats[('train','batch')].mean
    assert rec.overhead_per_batch < 0.01*step, (rec.overhead_per_batch, step)

def test_gpu_times_merge_across_ranks():
    "A record gathered from several ranks keeps the GPU columns, merged like the wall times"
    from fastprofile.distributed import RankProfile, merge_records, record_state, record_from_state
    recs = []
    for r,bwd in enumerate((.030, .050)):
        clock = FakeClock(); fs = FakeStream(clock)
        rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=3, warmup=0)
        rec.start_fit(); rec.start_epoch(0); drive_gpu_batches(rec, clock, fs, n=10, gpu=dict(backward=bwd)); rec.end_epoch(); rec.end_fit()
        recs.append(RankProfile(r, record_from_state(record_state(rec))))  # what the gather sends
    m = merge_records(recs)
    r = m.results().set_index(['Phase','Action','Step'])
    assert r.loc[('train','batch','backward'),'Number of Calls'] == 20
    assert abs(r.loc[('train','batch','backward'),'GPU Mean Duration'] - .040) < 1e-9
    assert 'GPU idle:' in make_report(m).plain()
