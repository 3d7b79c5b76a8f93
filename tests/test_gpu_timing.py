"GPU-true timings: mode selection on CPU; the events path end to end on CPU (wall-clock stand-ins); on a CUDA GPU, events recover known GPU costs within 5% of sync"
import math, pickle, time, warnings, pytest, torch
from torch import nn
import pandas as pd
from fastai.basics import *
from fastai.callback.core import Callback
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.testing import FakeClock, FakeStream, FakeEvent, drive_gpu_batches
from fastprofile.engine.gpu_timing import GpuProfileRecord, resolve_timing
from fastprofile.engine.record import Row
from fastprofile.lifecycle.session import train_device
from bench.gpu_timing import known_cost_learner, cycles_for

def _report(rec, sections=()) -> str:
    "The plain-text report of a closed record, as the end of a profiled call builds it"
    return ProfileResult(rec, sections=sections).report.plain()

def _gpu_record(n=10, pool_batches=3, **kwargs):
    "A closed `GpuProfileRecord` of `n` training batches on a fake GPU (forward 20 ms, backward 30 ms of GPU work...)"
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=pool_batches, warmup=0)
    rec.before_fit(); rec.before_epoch(0); drive_gpu_batches(rec, clock, fs, n=n, **kwargs); rec.close()
    return rec

def test_auto_is_wall_on_cpu():
    learn = synth_learner(n_trn=4, n_val=2)
    learn.profile(show_report=False, logger_callback=None).fit(1)
    rec = learn.simple_profile_record
    assert rec.timing == 'wall' and not isinstance(rec, GpuProfileRecord)
    assert 'GPU Mean Duration' not in learn.simple_profile_results
    assert 'Timing: wall clock;' in learn.simple_profile_report.plain()

def test_timing_follows_the_device_fastai_trains_on():
    "The mode is chosen at `before_fit`, before fastai moves the model to the DataLoaders' device: it follows that device"
    learn = synth_learner(n_trn=2, n_val=1)
    learn.dls.device = torch.device('cuda')        # a model built on the CPU, DataLoaders on the GPU: it trains on the GPU
    assert next(learn.model.parameters()).device.type == 'cpu'
    assert train_device(learn) == torch.device('cuda') and resolve_timing('auto', train_device(learn)) == 'events'
    learn.dls.device = None                        # fastai leaves the model where it is
    assert train_device(learn) == torch.device('cpu') and resolve_timing('auto', train_device(learn)) == 'wall'
    with pytest.raises(ValueError, match="needs a model on a CUDA device"): resolve_timing('events', train_device(learn))
    with pytest.raises(ValueError, match="needs a model on a CUDA device"): learn.profile(timing='events')  # refused at the call

class _WallEvent:
    "`torch.cuda.Event` stand-in on a CPU: records `perf_counter`, always complete; CUDA's errors for unrecorded events"
    made = 0
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        assert enable_timing, "timing events must be created with enable_timing=True"
        self.t = None; _WallEvent.made += 1
    def record(self, stream=None): self.t = time.perf_counter()
    def query(self): return True
    def synchronize(self): pass
    def elapsed_time(self, end):
        if self.t is None or end.t is None: raise RuntimeError('Both events must be recorded before calculating elapsed time')
        return (end.t - self.t)*1e3

class CountEvents(Callback):
    "Events made before the first batch (pool, calibration) and at the end of the fit"
    order = 2000
    def before_train(self):
        if not hasattr(self, 'at_start'): self.at_start = _WallEvent.made
    def after_fit(self): self.at_end = _WallEvent.made

def _as_if_on_cuda(monkeypatch):
    "CUDA events stood in by wall-clock ones, and the timing mode resolved as on a CUDA model; the pair calibrates afresh"
    import fastprofile.engine.core as fcore, fastprofile.learner as flearner, fastprofile.lifecycle.callback as fcb
    events = lambda timing, device: 'events'
    monkeypatch.setattr(fcore, 'resolve_timing', events)     # the record made at the first fit's start
    monkeypatch.setattr(flearner, 'resolve_timing', events)  # `profile()`'s check at the call
    monkeypatch.setattr(fcb, '_OVERHEAD', {})                # the pair's cost is calibrated in events mode, in this fit
    monkeypatch.setattr(torch.cuda, 'Event', _WallEvent)
    monkeypatch.setattr(torch.cuda, 'current_stream', lambda device=None: None)

PHASE_MS = dict(forward=1., backward=3., opt_step=5.)  # each a distinct known cost: a step's events read as another's are 2 ms off or more

def test_events_mode_end_to_end_in_a_real_fit(monkeypatch, tmp_path):
    "`timing='events'` in a real fit, CUDA events stood in by wall-clock ones: GPU columns everywhere, each step's its own, same losses"
    from fastprofile.analysis.trace import trace_events, GPU_TID
    N = 100  # training batches an epoch
    def losses(timing):
        learn = known_cost_learner(PHASE_MS, spin=lambda ms: time.sleep(ms/1e3), cuda=False, n_batches=N, n_valid=4)
        learn.path = tmp_path; learn.add_cb(CountEvents())
        learn.profile(timing=timing, show_report=False, logger_callback=None, save_csv=True, keep_batches=50).fit(2, 1e-2)
        return learn,[float(v) for v in learn.recorder.losses]
    _,plain = losses('wall')
    _as_if_on_cuda(monkeypatch)
    _WallEvent.made = 0
    learn,ev = losses('events')
    assert ev == plain                                            # timing never changes training
    rec = learn.simple_profile_record
    assert isinstance(rec, GpuProfileRecord) and rec.timing == 'events'
    c = learn.count_events
    assert c.at_start == c.at_end                                 # no event made per batch: the pool's rows are reused
    assert c.at_start == rec.pool.n_events                        # the fit's pool only: the pair's cost is measured when first asked for
    assert rec.n_waits == 0 and not rec._pending                  # every batch resolved by the end of the fit
    made = _WallEvent.made
    cost = rec.overhead_per_batch                                 # the pair's own cost, calibrated now, with events ...
    import fastprofile.lifecycle.callback as fcb
    test_eq(fcb._OVERHEAD, {('events', 'cpu'): cost})              # one calibration, in events mode, for this process
    assert 1e-6 < cost < 1e-3, cost                               # some µs: 2 callbacks × 13 events a batch, events on one in 7 (floored at 0)
    assert _WallEvent.made == made + 4*13                         # ... in a 4-row scratch pool
    r = learn.simple_profile_results.set_index(['Phase','Action','Step'])
    df = rec.recent()
    sampled = (df.iter >= 1) & ((df.iter - 1) % 7 == 0)              # events on one batch in 7 past the warm-up (the default)
    assert len(df) == 50 and (df.draw_gpu.notna() == sampled).all()
    t = df[sampled & (df.phase == 'train')]
    for c in ('draw','batch','forward','backward','opt_step'):      # a sampled batch's GPU times are its wall times (events read right after each mark)
        assert (t[f'{c}_gpu'] - t[c]).abs().median() <= 0.2*t[c].median() + 20e-6, c
    for c,ms in PHASE_MS.items():                                   # ... each step's own: at least its known cost (a sleep is never shorter)
        assert t[f'{c}_gpu'].min() >= ms/1e3, (c, t[f'{c}_gpu'].min())
    assert r.loc[('train','batch','backward'),'Number of Calls'] == 2*(N - 1)
    assert rec.gpu_stats[Row('train','batch','backward')].n == 2*len(range(1, N, 7))
    g = r.loc[('train','batch','backward')]
    assert abs(g['GPU Total Time'] - g['GPU Mean Duration']*2*(N - 1)) < 1e-12   # the sample's mean, over every batch
    txt = learn.simple_profile_report.plain()
    assert 'CUDA events' in txt and 'GPU idle' in txt and f"{2*len(range(1, N, 7))} train + 2 valid batches, one in 7" in txt, txt
    csv = pd.read_csv(tmp_path/'simple_profile.csv')
    assert 'GPU Mean Duration' in csv.columns
    assert df.predict_gpu.notna().sum() == 1                         # the last valid phase's batches 0-3: batch 1 sampled
    assert any(e.get('tid') == GPU_TID and e['ph'] == 'X' for e in trace_events(learn))
    back = pickle.loads(pickle.dumps(rec))                        # learn.export pickles the record: no events in it
    assert getattr(back, 'pool', None) is None and back.results().equals(rec.results())

def test_events_mode_fine_tune_is_one_call(monkeypatch):
    "Two fits in one call (`fine_tune`) on the events path: one record, one event pool, both stages timed on the GPU"
    _as_if_on_cuda(monkeypatch)
    _WallEvent.made = 0
    learn = synth_learner(n_trn=20, n_val=4, cbs=CountEvents())
    learn.profile(show_report=False, logger_callback=None).fine_tune(1, freeze_epochs=1)
    rec = learn.simple_profile_record
    assert isinstance(rec, GpuProfileRecord) and [s.epochs for s in rec.stages] == [1, 1]
    assert learn.count_events.at_end == rec.pool.n_events           # one pool for the call (the calibration: when first asked for)
    assert rec.gpu_stats[Row('train','batch','forward')].n == 2*len(range(1, 19+1, 7))  # 19 batches past the warm-up in each fit: one in 7

def test_events_record_keeps_its_timing_when_pickled_or_gathered():
    "`learn.export()` and the DDP gather send `state()`: the record read back still says its GPU times came from CUDA events"
    rec = _gpu_record()
    back = pickle.loads(pickle.dumps(rec))
    assert back.timing == 'events' and 'CUDA events' in _report(back)
    m = _gather_two(rec, _gpu_record())
    assert m.timing == 'events' and all(p.record.timing == 'events' for p in m.ranks)

def test_report_layout_with_both_clocks():
    rec = _gpu_record(n=12)
    assert rec.timing == 'events'
    rep = ProfileResult(rec).report
    f = rep.formatted()
    assert f.columns[-2:].tolist() == ['GPU Mean','GPU Total']  # the labels of every rendered form (`col_label`)
    assert rep.results.columns[-2:].tolist() == ['GPU Mean Duration','GPU Total Time']
    row = f[(rep.results.Action=='batch') & (rep.results.Step=='backward')].iloc[0]
    assert row['GPU Mean'] == '30.00 ms' and row['Mean'] == '1.00 ms'
    txt = rep.plain()
    assert 'CUDA events' in txt and 'GPU idle:' in txt and 'mostly the backward pass' in txt

def test_pool_is_bounded_and_resolves_everything():
    clock = FakeClock(); fs = FakeStream(clock); made = []
    def mk(): e = FakeEvent(fs); made.append(e); return e
    rec = GpuProfileRecord(make_event=mk, clock=clock, pool_batches=5, warmup=0, fold_every=7)
    rec.before_fit(); rec.before_epoch(0); drive_gpu_batches(rec, clock, fs, n=300); rec.close()
    assert len(made) == 5*13
    assert rec.gpu_stats[Row('train','batch','backward')].n == 300
    assert abs(rec.gpu_stats[Row('train','batch','backward')].mean - 0.030) < 1e-9
    r = rec.recent()
    assert 'backward_gpu' in r and abs(r.backward_gpu.iloc[-1] - 0.030) < 1e-9

def test_a_full_pool_waits_for_the_gpu():
    "The GPU behind the host (nothing syncs in a batch): with every row of the pool in flight the record waits for the oldest (`n_waits`)"
    from fastprofile.engine.record import Slot as S
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=2, warmup=0)
    gpu = dict(draw=.001, forward=.020, loss=.001, backward=.030, opt_step=.005, zero_grad=.0005)  # 57.5 ms of GPU work a batch
    spans = dict(draw=(S.DRAW_START, S.BATCH_START), forward=(S.FORWARD_START, S.FORWARD_END), loss=(S.LOSS_START, S.LOSS_END),
                 backward=(S.BACKWARD_START, S.BACKWARD_END), opt_step=(S.OPT_STEP_START, S.OPT_STEP_END),
                 zero_grad=(S.ZERO_GRAD_START, S.ZERO_GRAD_END))
    rec.before_fit(); rec.before_epoch(0); rec.before_phase('train')
    for i in range(10):  # 0.6 ms of host time a batch: the host queues work far ahead of the GPU
        for name,(a,z) in spans.items(): rec.mark(a); clock.tick(.0001); fs.launch(gpu[name]); rec.mark(z)
        rec.mark(S.BATCH_END); rec.end_batch(8)
        assert rec.n_waits == i and len(rec._pending) <= 2  # from the second batch's end on, the next batch's row is the oldest's: it waits
        assert clock() >= i*.0575  # for real: the host's clock is where the GPU finished the batch before
    rec.after_phase(); rec.close()
    assert not rec._pending and rec.n_waits == 9
    for name,g in gpu.items():  # each step's span is its work (the GPU busy with earlier work at its start); the draw's holds idle time too
        if name == 'draw': continue
        st = rec.gpu_stats[Row.part('train', name)]
        assert st.n == 10 and abs(st.mean - g) < 1e-9, (name, st.n, st.mean)

# ---- on a GPU ----


def test_known_cost_workload_spins_each_phase_once():
    "The GPU tests' workload, on CPU with a logging spin: forward, backward and optimizer step each spin once per batch"
    log = []
    learn = known_cost_learner(dict(forward=1, backward=2, opt_step=3), spin=log.append, cuda=False, n_batches=5, n_valid=2)
    learn.fit(1)
    assert log == [1, 2, 3]*5 + [1]*2

GPU_BOUND = dict(forward=8., backward=16., opt_step=4.)  # ms: long enough that autograd's ~0.45 ms start is under 3% of a span

@pytest.mark.cuda
def test_events_match_sync_and_wall_misattributes():
    "On a GPU-bound step the GPU columns (events on one batch in 7, the default) are within 5% of `timing='sync'`, both ways, and within 10% of the known work; wall alone misattributes"
    cycles = cycles_for(GPU_BOUND)
    res = {}
    for mode in ('sync','events','wall'):
        learn = known_cost_learner(cycles)
        learn.profile(timing=mode, show_report=False, logger_callback=None).fit(1)
        assert learn.simple_profile_record.timing == mode
        res[mode] = learn.simple_profile_results.set_index(['Phase','Action','Step'])
    for k,ms in GPU_BOUND.items():
        sync = res['sync'].loc[('train','batch',k),'Mean Duration']
        ev = res['events'].loc[('train','batch',k),'GPU Mean Duration']
        # 'sync' drains the GPU at each boundary, so its span also holds the host's time to the phase's first kernel
        # (autograd's start, ~0.45 ms on an H200): on spans this long that is within the 5%
        assert abs(ev - sync) <= 0.05*sync, (k, ev, sync)
        assert abs(ev*1e3 - ms) <= 0.1*ms, (k, ev, ms)
    # wall alone charges queued GPU work to a later phase: backward's wall time is far below its GPU time
    assert res['wall'].loc[('train','batch','backward'),'Mean Duration'] < 0.5*GPU_BOUND['backward']/1e3

@pytest.mark.cuda
def test_events_recorded_on_one_batch_in_seven(monkeypatch):
    "A real CUDA fit records 13 events on one training batch in 7 past the warm-up and 8 on one validation batch in 7; none on the others"
    # a count: what they cost a batch is measured from outside, by the GPU suite's overhead part (`CUDA events alone`)
    recorded = []
    real = torch.cuda.Event.record
    def record(self, stream=None): recorded.append(self); return real(self, stream)
    monkeypatch.setattr(torch.cuda.Event, 'record', record)
    learn = known_cost_learner(cycles_for(dict(forward=.1, backward=.1, opt_step=.1)), n_batches=40, n_valid=10)
    learn.profile(show_report=False, logger_callback=None, layers=False, efficiency=False, telemetry=False).fit(1)
    rec = learn.simple_profile_record
    sampled = lambda n: len(range(1, n, 7))  # batches 1, 8, 15...: past the one warm-up batch, one in 7
    assert rec.gpu_stats[Row('train','batch')].n == sampled(40) and rec.gpu_stats[Row('valid','batch')].n == sampled(10)
    assert len(recorded) == 13*sampled(40) + 8*sampled(10), len(recorded)  # validation: its 7 marks and `zero_grad`'s end (the straggler analysis reads its wall mark)
    assert rec.stats[Row('train','batch')].n == 39  # wall times for every batch past the warm-up

def _conv_learner(setup:str, cuda:bool, profile:str|None):
    "A small conv net on random images, set up as `setup` ('fp32', 'fp16', 'bf16', 'channels_last', 'prefetch')"
    from torch.utils.data import TensorDataset
    from fastai.data.core import TfmdDL
    from fastai.callback.fp16 import MixedPrecision  # noqa: F401 (Learner.to_fp16/to_bf16)
    from fastai.callback.channelslast import ChannelsLast  # noqa: F401 (Learner.to_channelslast)
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    ds = lambda n: TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 2, (n,), generator=g))
    dls = DataLoaders(TfmdDL(ds(96), bs=16, shuffle=True), TfmdDL(ds(32), bs=16), device='cuda' if cuda else 'cpu')
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    learn = Learner(dls, model, loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=1e-2)
    if setup == 'fp16': learn.to_fp16()
    if setup == 'bf16': learn.to_bf16()
    if setup == 'channels_last': learn.to_channelslast(use_amp=False)
    if setup == 'prefetch': learn.prefetch()
    if profile: learn.profile(timing=profile, show_report=False, logger_callback=None)
    return learn

def _losses_and_results(setup, cuda, profile):
    learn = _conv_learner(setup, cuda, profile)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # CudaPrefetch's unpinned-batches note
        learn.fit(2)
    res = learn.simple_profile_results.set_index(['Phase','Action','Step']) if profile else None
    return [float(v) for v in learn.recorder.losses],res

def test_channels_last_same_losses_on_cpu():
    "On CPU (wall clock): channels_last trains to the same losses with and without the profiler"
    plain,_ = _losses_and_results('channels_last', False, None)
    prof,res = _losses_and_results('channels_last', False, 'auto')
    assert prof == plain
    assert res.loc[('train','batch','forward'),'Mean Duration'] > 0

@pytest.mark.cuda
@pytest.mark.parametrize('setup', ['fp32', 'fp16', 'bf16', 'channels_last', 'prefetch'])
def test_events_with_mixed_precision_channels_last_and_prefetch(setup, monkeypatch):
    "CUDA events time every phase with to_fp16/to_bf16/channels_last/CudaPrefetch, and change no loss"
    monkeypatch.setattr(torch.backends.cudnn, 'deterministic', True)
    monkeypatch.setattr(torch.backends.cudnn, 'benchmark', False)
    plain,_ = _losses_and_results(setup, True, None)
    prof,res = _losses_and_results(setup, True, 'events')
    torch.testing.assert_close(torch.tensor(prof), torch.tensor(plain))
    for step in ('forward','loss','backward','opt_step'):
        g = res.loc[('train','batch',step),'GPU Mean Duration']
        assert g > 0 and not math.isnan(g), (setup, step, g)

@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_events_on_a_second_gpu():
    "A model on cuda:1: events are recorded on that device's stream"
    learn = known_cost_learner(cycles_for(dict(forward=1., backward=1., opt_step=.5)))
    learn.dls.to('cuda:1'); learn.model.to('cuda:1')
    learn.profile(timing='events', show_report=False, logger_callback=None).fit(1)
    res = learn.simple_profile_results.set_index(['Phase','Action','Step'])
    assert abs(res.loc[('train','batch','backward'),'GPU Mean Duration'] - 1e-3) < 2e-4

def _gather_two(rec0, rec1):
    "Rank 0 and rank 1 gather through the real store protocol (a `HashStore`, rank 1 in a thread): what rank 0 merges"
    import threading
    import torch.distributed as dist
    from fastprofile.analysis.distributed import gather_profiles, merge_gathered
    store = dist.HashStore()
    t = threading.Thread(target=gather_profiles, args=(rec1,), kwargs=dict(timeout=30., store=store, rank=1, world=2))
    t.start()
    got = gather_profiles(rec0, timeout=30., store=store, rank=0, world=2)
    t.join()
    assert not got.missing, got.missing
    return merge_gathered(got)

def test_gpu_times_merge_across_ranks():
    "A record gathered from several ranks keeps the GPU columns, merged like the wall times"
    from fastprofile.analysis.distributed import distributed_section
    m = _gather_two(_gpu_record(gpu=dict(backward=.030)), _gpu_record(gpu=dict(backward=.050)))
    r = m.results().set_index(['Phase','Action','Step'])
    assert r.loc[('train','batch','backward'),'Number of Calls'] == 20
    assert abs(r.loc[('train','batch','backward'),'GPU Mean Duration'] - .040) < 1e-9
    assert 'GPU idle:' in _report(m, [distributed_section])
