"""Telemetry (issue 24) on CPU: the sampler thread's tags against the record's own batch times, CPU utilization per phase and
per row on real fits (a loader that sleeps shows an idle process in `draw`), energy by trapezoids, throttling and the
diagnosis, NVML missing, the thread joined on every exit path, nothing on the per-batch path; and `memory_snapshot`.

NVML needs a GPU's driver: `fastprofile.testing.FakeNvml` stands in, written to its documented API (`NVML_SIGNATURES`,
checked against the real module `pynvml`, which nvidia-ml-py installs without a GPU: a `dev` extra). The
allocator's history functions are stood in by `FakeCudaMemory`, each call checked against torch's real signature."""
import inspect, math, pickle, sys, threading, time
import numpy as np, pytest, torch
from torch import nn
from torch.utils.data import Dataset
from fastai.basics import *
from fastai.test_utils import synth_learner
import fastprofile.learner as fl
from fastprofile.lifecycle.session import Session
from fastprofile.probes.telemetry.facts import Telemetry, Where, ROWS
from fastprofile.probes.telemetry.probe import TelemetryProbe, TelemetrySampler, open_gpu, where
from fastprofile.probes.telemetry.report import telemetry_summary, TelemetryWindow, telemetry_rank_lines
from fastprofile.probes.memory_snapshot import MemorySnapshotProbe, snapshot_path
from fastprofile.engine.core import probe_scalars, LiveScalars
from fastprofile.analysis.diagnosis import diagnose
from fastprofile.probes.telemetry.probe import gpu_agreement
from fastprofile.testing import FakeNvml, FakeCudaMemory, FakeClock, NVML_SIGNATURES, busy_gpu
from test_core import Raiser, EXITS

QUIET = dict(show_report=False, logger_callback=None)

def sampler_threads(): return [t for t in threading.enumerate() if t.name == 'fastprofile-telemetry']

def arm(learn, nvml=None, **opts):
    "`learn.profile(**opts)` quietly, its telemetry probe reading `nvml` (a stand-in) if given; the probe"
    learn.profile(**QUIET, **opts)
    probe = next(p for p in Session.of(learn).probes if isinstance(p, TelemetryProbe))
    if nvml is not None: probe.nvml = nvml
    return probe

# ---------------------------------------------------------------- a fit whose draws sleep and whose batches compute

class Sleepy(Dataset):
    "Items that each take `delay` seconds to load (sleeping: the process idles)"
    def __init__(self, n, delay): self.x,self.delay = torch.randn(n, 4, generator=torch.Generator().manual_seed(n)),delay
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.x[i],self.x[i].sum(0, keepdim=True)

class Busy(nn.Module):
    "A linear layer whose forward keeps the CPU busy `spin` seconds"
    def __init__(self, spin): super().__init__(); self.lin,self.spin = nn.Linear(4, 1),spin
    def forward(self, x):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.spin: pass
        return self.lin(x)

def sleepy_learner(n_trn=12, n_val=2, bs=4, delay=.005, spin=.02):
    "Draws of about `bs*delay` seconds of sleep, batches of about `spin` seconds of computing"
    dls = DataLoaders(DataLoader(Sleepy(n_trn*bs, delay), bs=bs), DataLoader(Sleepy(n_val*bs, delay), bs=bs))
    return Learner(dls, Busy(spin), loss_func=MSELossFlat())

@pytest.fixture(scope='module')
def sleepy():
    "One sampled fit of `sleepy_learner` (every 5 ms, a stand-in GPU)"
    learn = sleepy_learner()
    nv = FakeNvml()
    arm(learn, nv, telemetry=True, telemetry_every=.005)
    learn.fit(1)
    return learn,nv

def test_stand_in_has_the_documented_nvml_signatures():
    "FakeNvml's functions take exactly the parameters of nvidia-ml-py's (as documented: NVML_SIGNATURES)"
    nv = FakeNvml()
    for name,params in NVML_SIGNATURES.items(): assert tuple(inspect.signature(getattr(nv, name)).parameters) == params, name
    with pytest.raises(TypeError): nv.nvmlDeviceGetClockInfo(None)  # the clock type is required, as in NVML

def test_real_nvml_has_the_documented_signatures():
    "NVML_SIGNATURES (the stand-in's API) is nvidia-ml-py's: its module imports and is inspected without a GPU (nothing is called)"
    try: import pynvml
    except ImportError: pytest.fail("nvidia-ml-py is a `dev` extra (pyproject.toml): pip install -e '.[dev]'")
    for name,params in NVML_SIGNATURES.items():
        if name == 'nvmlDeviceGetCurrentClocksEventReasons' and not hasattr(pynvml, name): continue  # before nvidia-ml-py 12.535
        assert tuple(inspect.signature(getattr(pynvml, name)).parameters) == params, name

def test_allocator_stand_in_checks_torchs_signature(tmp_path):
    m = FakeCudaMemory()
    with pytest.raises(TypeError): m._record_memory_history(max_events=10)
    m._record_memory_history(max_entries=10)
    with pytest.raises(TypeError): m._dump_snapshot(str(tmp_path/'x.pickle'), 'extra', 'args')

# ---------------------------------------------------------------- tags

def test_tags_follow_the_phases(sleepy):
    "Each sample taken inside a batch's draw is tagged `draw`, inside its batch `batch` (the record's own marks, same clock)"
    learn,_ = sleepy
    tel,df = learn.simple_profile.facts.telemetry,learn.simple_profile_record.recent()
    smp = tel.frame()
    df = df[df.phase == 'train']
    m = 1e-3  # samples within 1 ms of a mark may be on either side of it
    checked,wrong = 0,[]
    for r in df.itertuples():
        for want,a,b in (('draw', r.draw_start, r.batch_start), ('batch', r.batch_start, r.batch_end)):
            inside = smp[(smp.time > a + m) & (smp.time < b - m)]
            checked += len(inside)
            wrong += [(want, x.action, x.phase) for x in inside.itertuples() if (x.phase, x.action) != ('train', want)]
    assert checked >= 40, checked
    assert len(wrong) <= .05*checked, wrong  # a sample's clock is read a few µs before its tag: a preempted thread may be late
    got = set(zip(smp.phase, smp.action))
    assert {('train','draw'), ('train','batch'), ('valid','draw'), ('valid','batch')} <= got

def test_cpu_utilization_per_phase_and_row(sleepy):
    "A loader that sleeps leaves the process idle in `draw`; a computing batch keeps a core busy"
    learn,_ = sleepy
    tel = learn.simple_profile.facts.telemetry
    draw,batch = tel.cpu('train','draw'),tel.cpu('train','batch')
    assert draw is not None and batch is not None
    assert draw < .3 and batch > 2*draw, (draw, batch)
    assert 0 < tel.cpu('train') < 1.5 and tel.cpu('valid') is not None
    s = learn.simple_profile_telemetry
    assert s['cpu_cores']['train_draw'] == draw and s['gpu_utilization']['train'] == 95.
    sec = learn.simple_profile.report.section('Telemetry')
    assert any(l.startswith('CPU (this process') and 'train draw' in l for l in sec.lines)

def test_cpu_per_phase_by_default_no_thread():
    "The default profile on a CPU: CPU utilization per phase (read at its boundaries), no sampler thread, nothing per batch"
    learn = sleepy_learner(n_trn=4, n_val=1, spin=.01)
    started = []
    real = threading.Thread.start
    def start(self): started.append(self.name); return real(self)
    threading.Thread.start = start
    try: learn.profile(**QUIET).fit(1)
    finally: threading.Thread.start = real
    tel = learn.simple_profile.facts.telemetry
    assert 'fastprofile-telemetry' not in started and not tel.sampled and tel.samples == 0
    assert tel.cpu('train') is not None and tel.cpu('train','draw') is None
    lines = learn.simple_profile.report.section('Telemetry').lines
    assert len(lines) == 1 and '`telemetry=True`' in lines[0]
    learn.profile(**QUIET, telemetry=False).fit(1)
    assert learn.simple_profile.facts.telemetry is None and learn.simple_profile.report.section('Telemetry') is None

def test_probe_is_not_on_the_batch_path():
    "The probe is no callback: the learner's callbacks during a profiled fit are the same with telemetry on or off"
    seen = {}
    class Look(Callback):
        def before_train(self): seen.setdefault(self.name_, []).append([type(c).__name__ for c in self.learn.cbs])
    for opt in (False, True):
        learn = synth_learner(n_trn=3, n_val=1, cbs=Look())
        Look.name_ = str(opt)
        learn.profile(**QUIET, telemetry=opt).fit(1)
    assert seen['False'] == seen['True']
    assert not isinstance(TelemetryProbe(), Callback)
    assert not any(hasattr(TelemetryProbe, e) for e in ('before_batch', 'after_batch', 'before_draw', 'after_pred'))

def test_no_nvml_sample_on_the_main_thread():
    "NVML is read on the sampler's thread only: the main thread's calls (open, shut) do not grow with the batches"
    main = threading.get_ident()
    counts = []
    for n in (3, 12):
        learn,nv = synth_learner(n_trn=n, n_val=1),FakeNvml()
        arm(learn, nv, telemetry=True, telemetry_every=.005)
        learn.fit(1)
        counts.append(sum(t == main for _,t in nv.calls))
        assert any(name == 'nvmlDeviceGetUtilizationRates' and t != main for name,t in nv.calls)
    assert counts[0] == counts[1], counts

# ---------------------------------------------------------------- energy, throttling

def test_energy_integrates_by_trapezoids():
    "Known power samples at known times: the trapezoids; a linear power ramp on a real thread: its exact integral, and NVML's counter"
    clock = FakeClock()
    watts = [(0., 50.), (.5, 150.), (1.5, 150.), (3., 0.)]
    nv = FakeNvml(reading=lambda t: dict(busy_gpu(t), power=dict(watts)[t]), clock=clock)
    tel = Telemetry()
    s = TelemetrySampler(tel, lambda: (Where.TRAIN_BATCH, None), open_gpu('cpu', nv), clock=clock, cpu_clock=clock)
    for t,_ in watts: clock.t = t; s.sample()
    assert tel.energy == pytest.approx(50 + 150 + 112.5)
    t0 = time.perf_counter()
    ramp = FakeNvml(reading=lambda t: dict(busy_gpu(t), power=100. + 400*(t - t0)))
    learn = synth_learner(n_trn=20, n_val=2)
    arm(learn, ramp, telemetry=True, telemetry_every=.005)
    learn.fit(1)
    tel = learn.simple_profile.facts.telemetry
    exact = 100*(tel.last - tel.first) + 200*((tel.last - t0)**2 - (tel.first - t0)**2)
    assert tel.samples > 5 and tel.energy == pytest.approx(exact, rel=.01)
    assert tel.energy_counter == pytest.approx(tel.energy, rel=.02)
    s = learn.simple_profile_telemetry
    assert s['joules_per_sample'] == pytest.approx(tel.energy/(22*16))

def throttled_gpu(t):
    "Half the samples throttled by the power cap (and, one in four, heat)"
    k = int(t*1000) % 4
    return dict(busy_gpu(t), clock=1500 if k < 2 else 1980, reasons=(0x4 | (0x40 if k == 0 else 0)) if k < 2 else 0, temp=85)

def test_throttling_is_read_and_is_a_finding():
    learn = sleepy_learner(n_trn=40, n_val=1, delay=0., spin=.004)
    arm(learn, FakeNvml(throttled_gpu), telemetry=True, telemetry_every=.005)
    learn.fit(1)
    th = learn.simple_profile.facts.telemetry.throttling()
    assert th.busy > 10 and .2 < th.share < .8 and th.clock == 1500. and th.max_clock == 1980.
    # each NVML field is its own call: a sample read across a millisecond boundary of `throttled_gpu` may miss its reason
    assert th.reasons['SW power cap'] > .8 and 0 < th.reasons['HW thermal slowdown'] < 1.
    lines = learn.simple_profile.report.section('Telemetry').lines
    assert any(l.startswith('Throttling: the SM clock was below its maximum (1,980 MHz)') and 'SW power cap (' in l for l in lines)
    f = [f for f in diagnose(learn).findings if f.resource == 'throttling']
    assert len(f) == 1 and 'SW power cap' in f[0].fix and 'nvidia-smi' in f[0].fix and f[0].kind == 'bound'
    learn = synth_learner(n_trn=6, n_val=2)
    arm(learn, FakeNvml(), telemetry=True, telemetry_every=.005)
    learn.fit(1)
    assert not [f for f in diagnose(learn).findings if f.resource == 'throttling']

def test_the_gpu_corroborates_the_verdict():
    "An input-bound run whose GPU idles in its batches: the diagnosis says the GPU agrees; a busy GPU says the gain may be smaller"
    for util,start in ((20, 'The GPU agrees: the GPU was busy 20%'), (95, 'But the GPU was busy 95%')):
        learn = sleepy_learner(n_trn=8, n_val=1, delay=.004, spin=0.)
        arm(learn, FakeNvml(lambda t, u=util: dict(busy_gpu(t), util=u)), telemetry=True, telemetry_every=.005)
        learn.fit(1)
        d = diagnose(learn)
        assert d.verdict == 'input', d.lines()
        assert d.gpu.startswith(start) and d.gpu in d.evidence()
        assert d.gpu in learn.simple_profile.report.section('Diagnosis').more  # the GPU's word, in the evidence
    assert 'launch-bound' in gpu_agreement('compute', learn.simple_profile.facts.telemetry.__class__(
        gpu_sums=np.full((len(Where), 5), 10.), gpu_counts=np.ones((len(Where), 5))))

# ---------------------------------------------------------------- NVML missing or failing

def test_nvml_missing_one_line(monkeypatch):
    "The sampler asked for on a 'GPU' without nvidia-ml-py: one line says why, the CPU is still read, no warning"
    monkeypatch.setattr('fastprofile.probes.telemetry.probe.reads_gpu', lambda d: True)
    monkeypatch.setitem(sys.modules, 'pynvml', None)  # `import pynvml` raises ImportError
    learn = synth_learner(n_trn=4, n_val=1)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        learn.profile(**QUIET, telemetry=True).fit(1)
    lines = learn.simple_profile.report.section('Telemetry').lines
    assert lines[0] == "GPU readings off: nvidia-ml-py is not installed (`pip install nvidia-ml-py`)."
    assert sum('GPU readings off' in l for l in lines) == 1 and any(l.startswith('CPU (this process') for l in lines)
    learn = synth_learner(n_trn=4, n_val=1)
    arm(learn, FakeNvml(fail_init=True), telemetry=True)
    learn.fit(1)
    assert learn.simple_profile.report.section('Telemetry').lines[0].startswith('GPU readings off: NVML did not start (NVMLError')

def test_gpu_that_stops_answering(monkeypatch):
    "A GPU read that fails mid-run stops the GPU readings (said once in the section); the CPU goes on; NVML is shut"
    n = [0]
    def flaky(t):
        n[0] += 1
        if n[0] > 30: raise RuntimeError('GPU is lost')
        return busy_gpu(t)
    class Slow(Callback):  # 40 batches of at least 2 ms: dozens of 5 ms samples (some 6 reads each), however fast the machine
        def after_batch(self): time.sleep(.002)
    nv = FakeNvml(flaky)
    learn = synth_learner(n_trn=40, n_val=2, cbs=Slow())
    arm(learn, nv, telemetry=True, telemetry_every=.005)
    learn.fit(1)
    tel = learn.simple_profile.facts.telemetry
    assert tel.failure.startswith('reading the GPU failed and stopped (RuntimeError: GPU is lost)') and nv.inits == 0
    assert tel.samples > tel.gpu().n and tel.cpu_total[1] > 0

# ---------------------------------------------------------------- every exit path

@pytest.mark.parametrize('event,exc', EXITS, ids=[f'{e}-{x.__name__}' for e,x in EXITS])
def test_sampler_stops_and_joins_on_every_exit(event, exc):
    "An interrupt or an error at any event: the thread is joined and NVML shut by the time the exception reaches the caller"
    learn = synth_learner(n_trn=5, n_val=2, cbs=Raiser(event, exc, train=event not in ('before_validate','after_validate')))
    nv = FakeNvml()
    arm(learn, nv, telemetry=True, telemetry_every=.005)
    with pytest.raises(exc): learn.fit(2)
    assert not sampler_threads() and nv.inits == 0
    if event != 'before_fit':
        tel = learn.simple_profile.facts.telemetry
        assert tel.samples >= 2 and learn.simple_profile.record.telemetry is tel

def test_sampler_joined_when_a_probe_fails_at_the_end(monkeypatch):
    "Another probe raising in `after_call` (strict mode off) does not leave the thread running"
    monkeypatch.delenv('FASTPROFILE_STRICT', raising=False)
    monkeypatch.setattr(fl.LearnerFacts, 'after_call', lambda self, s: 1/0, raising=False)
    learn = synth_learner(n_trn=4, n_val=1)
    arm(learn, FakeNvml(), telemetry=True, telemetry_every=.005)
    with pytest.warns(UserWarning, match='ZeroDivisionError'): learn.fit(1)
    assert not sampler_threads()

def test_nested_validate_is_tagged_nested():
    "A `validate()` from a callback inside the fit: its samples are `fit nested`, not the phase's"
    class NestedValidate(Callback):
        def after_batch(self):
            if self.training and self.iter == 1: self.learn.validate()
            elif not self.training: time.sleep(.002)  # the nested validation lasts 60 ms or more: a dozen 5 ms samples
    learn = synth_learner(n_trn=4, n_val=30, cbs=NestedValidate())
    arm(learn, FakeNvml(), telemetry=True, telemetry_every=.005)
    learn.fit(1)
    assert learn.simple_profile.facts.telemetry.gpu('fit', 'nested').n >= 2

# ---------------------------------------------------------------- loggers, ranks

def test_window_scalars_for_the_loggers():
    """The loggers' rolling scalars, through the probe's protocol (`live_scalars`): means since this logger's last read,
    each logger its own window; after the call, the fit's energy and utilization (`scalars`, by `probe_scalars`)"""
    class Slow(Callback):  # 8 batches of at least 2 ms: the training phase lasts several 5 ms samples, even on a busy machine
        def after_batch(self): time.sleep(.002)
    learn = synth_learner(n_trn=8, n_val=1, cbs=Slow())
    probe = arm(learn, FakeNvml(), telemetry=True, telemetry_every=.005)
    learn.fit(1)
    assert probe.result is learn.simple_profile.facts.telemetry
    one,two = {},{}  # two loggers' states
    d = probe.live_scalars({}, one)
    assert d['gpu/utilization'] == 95. and d['gpu/power_w'] == 300. and 'cpu/cores' in d
    assert probe.live_scalars({}, one) == {}  # nothing new since this logger's last read
    assert probe.live_scalars({}, two) == d  # the other logger reads its own window: all of it
    wandb,tb = LiveScalars([probe]),LiveScalars([probe])  # what two sinks of one call keep (`WandbSink`, `TensorBoardSink`)
    assert wandb({}) == d and tb({}) == d and wandb({}) == {}
    assert TelemetryWindow().scalars(None) == {} and TelemetryProbe().live_scalars({}, {}) == {}  # before a call: nothing
    from fastprofile.probes.telemetry.report import telemetry_fit_scalars
    f = telemetry_fit_scalars(learn.simple_profile)
    assert f['gpu/utilization_train'] == 95. and f['energy/joules'] > 0
    got = probe_scalars(learn.simple_profile)  # what the sinks log after the call: under 0.2.0's names
    assert {k:v for k,v in got.items() if k in f} == f

def test_tensorboard_logs_the_telemetry(tmp_path):
    "With the samples/second charts: the GPU's and the CPU's readings at each log; the energy at the fit's end"
    from fastai.callback.tensorboard import TensorBoardCallback
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    learn = synth_learner(n_trn=20, n_val=2, cbs=TensorBoardCallback(tmp_path, trace_model=False, log_preds=False))
    learn.profile(show_report=False, logger_callback='tensorboard', log_every=5, telemetry=True, telemetry_every=.005)
    next(p for p in Session.of(learn).probes if isinstance(p, TelemetryProbe)).nvml = FakeNvml()
    learn.fit(1)
    ea = EventAccumulator(str(tmp_path), size_guidance={'scalars': 0}).Reload()
    tags = ea.Tags()['scalars']
    assert 'gpu/utilization' in tags and 'cpu/cores' in tags and 'energy/joules' in tags
    assert all(e.value == pytest.approx(95.) for e in ea.Scalars('gpu/utilization'))

def test_rank_lines_name_a_hot_straggler():
    "Under DDP each rank's telemetry travels with its record: the spread, and a straggler whose GPU is throttled named"
    from fastprofile.analysis.distributed import RankProfile, distributed_lines, merge_records
    recs = []
    for reading in (busy_gpu, throttled_gpu):
        learn = synth_learner(n_trn=60, n_val=1)  # long enough for the 5 ms sampler to read the GPU on a busy machine
        arm(learn, FakeNvml(reading), telemetry=True, telemetry_every=.005)
        learn.fit(1)
        recs.append(pickle.loads(pickle.dumps(learn.simple_profile_record)))  # as it travels to rank 0
    ranks = [RankProfile(0, recs[0]), RankProfile(1, recs[1])]
    assert isinstance(recs[1].telemetry, Telemetry) and recs[1].telemetry.throttled > 0
    lines = telemetry_rank_lines(ranks, [dict(rank=1)])
    assert TelemetryProbe.rank_lines(ranks, [dict(rank=1)]) == lines  # the probe's, as the Distributed section asks it
    assert any(l.strip().startswith('GPU throttled (busy samples)') and l.endswith('rank 1') for l in lines)
    assert lines[-1] == 'Rank 1, the straggler, has the most throttled GPU: it may explain the slowness.'
    m = merge_records(ranks)
    assert any(l.startswith('Telemetry across ranks') for l in distributed_lines(m))

# ---------------------------------------------------------------- memory snapshot

class OutOfMemory(Callback):
    "Raise CUDA's out-of-memory error at `event` of training batch 2"
    def __init__(self, event='after_pred'): self.event = event
    def __call__(self, event_name):
        if event_name == self.event and self.run and getattr(self.learn, 'training', False) and getattr(self.learn, 'iter', -1) == 2:
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
        return super().__call__(event_name)
    def before_draw(self): pass

@pytest.fixture
def allocator(monkeypatch):
    "`torch.cuda.memory`'s history functions stood in, and `memory_snapshot=True` taken for a CPU learner (as `bench.gpu.fakes` does)"
    mem = FakeCudaMemory()
    monkeypatch.setattr(torch.cuda.memory, '_record_memory_history', mem._record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, '_dump_snapshot', mem._dump_snapshot)
    monkeypatch.setattr(fl, 'check_memory_snapshot', lambda v, device: v)
    return mem

@pytest.mark.parametrize('event', ['before_batch', 'after_pred', 'after_loss', 'before_backward', 'after_backward', 'after_step', 'after_batch'])
def test_snapshot_on_out_of_memory(allocator, tmp_path, event):
    "OOM at a batch event: the snapshot next to the CSV, named in the error's note; the profile kept; the recording stopped"
    learn = synth_learner(n_trn=5, n_val=1, path=tmp_path, cbs=OutOfMemory(event))
    learn.profile(**QUIET, memory_snapshot=True, csv_name='runs/p.csv')
    with pytest.raises(torch.OutOfMemoryError) as e: learn.fit(1)
    path = tmp_path/'runs'/'p_oom.pickle'
    assert e.value.__notes__ == [f"fastprofile: CUDA's memory at this error, with the last 100,000 allocator events before it, is in "
                                 f"{path}: drag it into https://pytorch.org/memory_viz"]
    assert set(pickle.load(open(path, 'rb'))) == {'segments', 'device_traces', 'allocator_settings'}
    assert learn.simple_profile.facts.memory_snapshot == str(path) and learn.simple_profile.interrupted.startswith('OutOfMemoryError')
    assert not allocator.recording and [x[0] for x in allocator.log] == ['record', 'dump', 'record']
    assert allocator.log[0][2] == 100_000 and not (tmp_path/'runs'/'p.csv').exists()  # bounded; the CSV itself not asked for

@pytest.mark.parametrize('exc', [RuntimeError, KeyboardInterrupt, None])
def test_no_snapshot_without_out_of_memory(allocator, tmp_path, exc):
    "Another exception, or none: nothing written, the recording stopped"
    cbs = [Raiser('after_pred', exc)] if exc else []
    learn = synth_learner(n_trn=5, n_val=1, path=tmp_path, cbs=cbs)
    learn.profile(**QUIET, memory_snapshot=True)
    if exc:
        with pytest.raises(exc): learn.fit(1)
    else: learn.fit(1)
    assert list(tmp_path.iterdir()) == [] and not allocator.recording
    assert [x[0] for x in allocator.log] == ['record', 'record'] and learn.simple_profile.facts.memory_snapshot is None

def test_snapshot_in_a_profiling_block(allocator, tmp_path):
    "`with learn.profiling(memory_snapshot=True):` a fit that runs out: the snapshot; the block's exception is the OOM"
    learn = synth_learner(n_trn=5, n_val=1, path=tmp_path, cbs=OutOfMemory())
    with pytest.raises(torch.OutOfMemoryError) as e:
        with learn.profiling(**QUIET, memory_snapshot=True): learn.fit(1)
    assert (tmp_path/'simple_profile_oom.pickle').exists() and 'simple_profile_oom.pickle' in e.value.__notes__[0]
    assert not allocator.recording

def test_snapshot_when_the_block_catches_the_out_of_memory_error(allocator, tmp_path):
    "A `profiling()` block that catches a fit's out-of-memory error and goes on: the snapshot is written and named in the caught error; the block's next fit is profiled"
    learn = synth_learner(n_trn=5, n_val=1, path=tmp_path, cbs=OutOfMemory())
    with learn.profiling(**QUIET, memory_snapshot=True):
        with pytest.raises(torch.OutOfMemoryError) as e: learn.fit(1)
        learn.remove_cb(OutOfMemory); learn.fit(1)
    path = tmp_path/'simple_profile_oom.pickle'
    assert path.exists() and str(path) in e.value.__notes__[0]
    res = learn.simple_profile
    assert res.facts.memory_snapshot == str(path) and len(res.record.stages) == 2
    assert not allocator.recording and [x[0] for x in allocator.log] == ['record', 'dump', 'record']

def test_snapshot_path_under_ddp():
    assert snapshot_path('/x/simple_profile.csv', 3).name == 'simple_profile_oom_rank3.pickle'

# ---------------------------------------------------------------- on a real GPU (the GPU suite's `tests` part)

@pytest.mark.cuda
def test_real_gpu_telemetry_and_snapshot(tmp_path):
    "On a GPU: the sampler is on by default and reads NVML on its thread; a real out-of-memory error leaves a snapshot"
    pytest.importorskip('pynvml', reason='nvidia-ml-py is not installed')
    learn = synth_learner(n_trn=60, n_val=4, cuda=True, path=tmp_path)
    learn.profile(**QUIET, telemetry_every=.01)
    learn.fit(1)
    tel = learn.simple_profile.facts.telemetry
    assert tel.sampled and tel.gpu_off is None and tel.gpu_name and tel.failure is None and not sampler_threads()
    g = tel.gpu('train')
    assert g is not None and 0 <= g.util <= 100 and g.power > 0 and g.clock > 0 and tel.max_clock >= g.clock*.5
    assert tel.energy > 0 and (math.isnan(tel.energy_counter) or tel.energy_counter > 0)
    assert learn.simple_profile.report.section('Telemetry').lines[0].startswith('GPU: ')
    class Overflow(Callback):
        def after_pred(self):
            if self.training and self.iter == 2:
                self.learn.too_big = torch.empty(2*torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device='cuda')
    learn.add_cb(Overflow())
    learn.profile(**QUIET, memory_snapshot=True)
    with pytest.raises(torch.OutOfMemoryError) as e: learn.fit(1)
    path = tmp_path/'simple_profile_oom.pickle'
    assert str(path) in e.value.__notes__[-1]
    snap = pickle.load(open(path, 'rb'))
    assert 'segments' in snap and any(len(t) for t in snap['device_traces'])
    learn.remove_cb(Overflow); path.unlink()
    learn.profile(**QUIET, memory_snapshot=True)
    learn.fit(1)
    assert not path.exists()
