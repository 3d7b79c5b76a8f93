"Efficiency on real fastai Learners: FLOPs counted by hand, bit-identical training, failures, fine_tune, and the CUDA memory path on a stand-in"
import inspect, math, pickle, warnings
import numpy as np, pandas as pd, pytest, torch
from torch import nn
from fastai.basics import *
from fastai.callback.all import *
from fastai.test_utils import synth_learner
import torch.utils.flop_counter as tfc
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.nn.modules import module as _module
from fastprofile.all import *
from fastprofile.probes.efficiency.facts import *
from fastprofile.probes.efficiency.probe import *
from fastprofile.probes.efficiency.report import *
from fastprofile.probes.efficiency.report import _compute_share
from fastprofile.engine.core import row_flops_per_second, train_samples_per_second, LiveScalars, probe_scalars
from fastprofile.testing import FakeClock, drive_record

N_IN,H1,H2 = 16,64,32
FWD = 2*(N_IN*H1 + H1*H2 + H2*1)  # FLOPs per sample of the MLP's forward, by hand
BWD = 2*FWD - 2*N_IN*H1  # weight gradients everywhere, input gradients but for the first layer

def mlp(extra=()):
    return nn.Sequential(nn.Linear(N_IN, H1), nn.ReLU(), nn.BatchNorm1d(H1), nn.Dropout(.3), *extra,
                         nn.Linear(H1, H2), nn.ReLU(), nn.Linear(H2, 1))

def learner(n=128, bs=32, seed=0, model=None, **kw):
    set_seed(seed, reproducible=True)
    x = torch.randn(n, N_IN); y = x[:, :1]*2 + .1*torch.randn(n, 1)
    k = n*3//4
    dls = DataLoaders.from_dsets(list(zip(x[:k], y[:k])), list(zip(x[k:], y[k:])), bs=bs, device='cpu')
    learn = Learner(dls, model if model is not None else mlp(), loss_func=MSELossFlat(), **kw)
    learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, ProgressCallback)])
    learn.logger = noop
    return learn

def profiled(learn, **kw):
    kw.setdefault('show_report', False); kw.setdefault('logger_callback', None); kw.setdefault('efficiency', True)  # on a CPU: off unless asked
    return learn.profile(**kw)

def rows(learn): return learn.simple_profile_results.set_index(['Phase','Action','Step'])

def no_leftovers(learn):
    assert _get_current_dispatch_mode() is None, 'a dispatch mode is still on'
    assert not _module._global_forward_hooks and not _module._global_forward_pre_hooks
    assert '_do_one_batch' not in learn.__dict__ and '_backward' not in learn.__dict__
    assert not any(isinstance(cb, EfficiencyProbe) for cb in learn.cbs) and not hasattr(learn, 'efficiency')

# ---- the numbers ----

def test_hand_counted_mlp():
    learn = learner(n=256)
    profiled(learn, peak_flops=1e12).fit(2, 1e-3)
    e = learn.simple_profile_efficiency
    assert abs(e['forward_flops_per_sample'] - FWD) <= .01*FWD
    assert e['backward_flops_per_sample'] == BWD and e['predict_flops_per_sample'] == FWD
    r = rows(learn)
    n_batches = 2*(6-1)  # 6 training batches of 32 an epoch, the first one warm-up
    for step,flops in (('forward', FWD), ('backward', BWD), ('', FWD+BWD)):
        row = r.loc[('train','batch',step)]
        assert row['Number of Calls'] == n_batches
        assert math.isclose(row['FLOP/s'], flops*n_batches*32/row['Total Time'], rel_tol=1e-9)
    assert math.isclose(r.loc[('valid','batch','predict'),'FLOP/s'], FWD*2*32/r.loc[('valid','batch','predict'),'Total Time'], rel_tol=1e-9)
    assert r['FLOP/s'].notna().sum() == 7  # forward, backward, batch, train; predict, valid batch, valid
    assert np.isnan(r.loc[('train','batch','opt_step'),'FLOP/s']) and np.isnan(r.loc[('train','warmup',''),'FLOP/s'])
    assert 0 < e['mfu'] < 1 and math.isclose(e['mfu'], e['train_flops_per_second']/1e12)
    assert e['peak_source'] == 'given' and e['dtype'] == 'fp32'
    assert e['train_flops_per_second'] == r.loc[('train','batch',''),'FLOP/s']
    assert e['peak_rss'] > 0
    txt = learn.simple_profile_report.plain()
    assert 'Efficiency:' in txt and 'MFU: ' in txt and 'FLOPs per sample' in txt
    no_leftovers(learn)

def test_no_peak_on_cpu_says_how():
    learn = learner()
    profiled(learn).fit(1)
    e = learn.simple_profile_efficiency
    assert e['mfu'] is None and e['peak_flops'] is None and e['train_flops_per_second'] > 0
    assert any('pass `learn.profile(peak_flops=...)`' in l for l in learn.simple_profile_report.section('Efficiency').lines)

def conv_learner(seed=0):
    set_seed(seed, reproducible=True)
    x = torch.randn(48, 3, 8, 8); y = x.mean((1,2,3))[:, None]
    dls = DataLoaders.from_dsets(list(zip(x[:32], y[:32])), list(zip(x[32:], y[32:])), bs=8, device='cpu')
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout2d(.2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 1))
    learn = Learner(dls, model, loss_func=MSELossFlat())
    learn.remove_cbs([cb for cb in learn.cbs if isinstance(cb, ProgressCallback)]); learn.logger = noop
    return learn

@pytest.mark.parametrize('make', [learner, conv_learner], ids=['mlp-bn-dropout', 'conv-bn-dropout2d'])
def test_training_bit_identical(make):
    "Counting runs inside the real warm-up batch: same BatchNorm statistics, dropout draws, weights, losses and RNG state"
    def run(profile):
        learn = make(seed=3)
        if profile: profiled(learn)
        learn.fit_one_cycle(2, 1e-2)
        return learn.model.state_dict(), [float(v) for v in L(learn.recorder.losses)], learn.recorder.values, torch.get_rng_state()
    sd0,l0,v0,rng0 = run(False)
    sd1,l1,v1,rng1 = run(True)
    assert l0 == l1 and v0 == v1 and torch.equal(rng0, rng1)
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0)  # weights and running statistics, bit for bit

def test_conv_families_and_advice_inputs():
    learn = conv_learner()
    profiled(learn).fit(1)
    eff = learn.simple_profile.facts.efficiency
    fam = eff.family_flops()
    assert fam['conv'] > 0 and fam['matmul'] > 0 and eff.channels_last is False
    # conv forward by hand: 2 * C_in*k*k * C_out * H*W per sample, and the head
    assert eff.flops_per_sample()['forward'] == 2*3*9*8*64 + 2*8*1

def test_dtype_is_what_ran():
    "Under autocast (as `to_fp16()` does on a GPU), the matmuls' dtype is the compute dtype"
    class CpuAutocast(Callback):
        order = 10  # where fastai's MixedPrecision sits
        def before_batch(self): self.ac = torch.autocast('cpu', dtype=torch.bfloat16); self.ac.__enter__()
        def after_loss(self): self.ac.__exit__(None, None, None)
    learn = learner(cbs=CpuAutocast())
    profiled(learn).fit(1)
    e = learn.simple_profile_efficiency
    assert e['dtype'] == 'bf16' and e['forward_flops_per_sample'] == FWD

# ---- fits, stages, nesting ----

def frozen_learner():
    learn = learner()
    learn.splitter = lambda m: [params(m[:4]), params(m[4:])]
    learn.create_opt()
    return learn

def test_fine_tune_counts_each_fit():
    "The frozen fit's backward has no gradient for the body: each fit is counted, the rows use the batch-weighted mean"
    learn = frozen_learner()
    profiled(learn).fine_tune(2, freeze_epochs=1)
    eff = learn.simple_profile.facts.efficiency
    s1,s2 = eff.stages
    assert s1.forward == s2.forward == FWD
    assert s1.backward == BWD - 2*N_IN*H1  # frozen: no weight gradient for the first layer (BatchNorm stays trainable)
    assert s2.backward == BWD
    assert (s1.train_batches, s2.train_batches) == (3, 6)
    w = eff.flops_per_sample()['backward']
    assert math.isclose(w, (3*s1.backward + 6*s2.backward)/9)
    assert rows(learn).loc[('train','batch','backward'),'FLOP/s'] > 0
    assert any('Backward per fit' in l for l in learn.simple_profile_report.section('Efficiency').lines)

def test_not_a_fit_counts_nothing():
    "validate, get_preds, lr_find while armed: no counting, no shadow; the training call that follows counts"
    learn = learner()
    profiled(learn)
    cb = first(c for c in learn.cbs if isinstance(c, EfficiencyProbe))
    learn.validate(); learn.get_preds(); learn.lr_find(num_it=3, show_plot=False)
    assert cb.result.stages == [] and '_do_one_batch' not in learn.__dict__
    learn.fit(1)
    assert learn.simple_profile_efficiency['forward_flops_per_sample'] == FWD
    no_leftovers(learn)

def test_validate_inside_a_fit_is_not_counted_as_training():
    class MidValidate(Callback):
        order = 995  # after the efficiency callback has set up the counting of validation's first batch
        def before_validate(self):
            if not getattr(self, 'done', False): self.done = True; self.learn.validate()
    learn = learner(cbs=MidValidate())
    profiled(learn).fit(1)
    e = learn.simple_profile_efficiency
    assert e['forward_flops_per_sample'] == FWD and e['backward_flops_per_sample'] == BWD and e['predict_flops_per_sample'] == FWD
    no_leftovers(learn)

@pytest.mark.parametrize('on_gpu', [False, True], ids=['cpu', 'cuda-stand-in'])
def test_per_batch_table_empty_after_warmup(on_gpu):
    "Once its warm-up work is done the callback has no per-batch event, and (driven by the profile's session) is off `learn.cbs`: fastai no longer calls it at every event"
    seen = {}
    class Probe(Callback):
        order = 995
        def before_batch(self):
            listed = eff in self.learn.cbs
            assert listed == bool(batch_events & set(eff._handlers))  # in `learn.cbs` exactly while it has per-batch work
            seen[(self.training, self.iter)] = listed
    batch_events = {'before_batch','after_pred','before_backward','after_backward','before_step','after_step','after_batch'}
    learn = learner(n=224, cbs=Probe())  # 5 training batches (drop_last), 2 validation batches
    profiled(learn, warmup=2)
    eff = first(c for c in learn.cbs if isinstance(c, EfficiencyProbe))
    cbs = list(learn.cbs)
    if on_gpu: eff.cuda_api = FakeCudaMemory()
    learn.fit(1)
    assert eff not in learn.cbs and not hasattr(learn, eff.name) and eff.learn is None  # taken off with the session's undo, as fastai's `remove_cb` does
    assert list(learn.cbs) == [c for c in cbs if not isinstance(c, (EfficiencyProbe, SimpleProfilerCallback, SimpleProfilerPostCallback))]
    # counting needs the first batch of each phase; memory sampling (CUDA) every warm-up training batch
    assert seen == {(True,0): True, (True,1): on_gpu, (True,2): False, (True,3): False, (True,4): False,
                    (False,0): True, (False,1): False}
    assert learn.simple_profile_efficiency['predict_flops_per_sample'] == FWD
    if on_gpu: assert learn.simple_profile.facts.efficiency.sampled == 2

# ---- failures: one line in the report, nothing else breaks ----

def test_formula_failure_one_line():
    def boom(*args, **kwargs): raise RuntimeError('shape not understood')
    old = tfc.flop_registry[torch.ops.aten.addmm]
    tfc.flop_registry[torch.ops.aten.addmm] = boom
    try:
        def run(profile):
            learn = learner(seed=5)
            if profile: profiled(learn)
            learn.fit(1, 1e-2)
            return learn, [float(v) for v in L(learn.recorder.losses)]
        (_,l0),(learn,l1) = run(False),run(True)
    finally: tfc.flop_registry[torch.ops.aten.addmm] = old
    assert l0 == l1
    lines = learn.simple_profile_report.section('Efficiency').lines
    bad = [l for l in lines if l.startswith('FLOPs:')]
    assert len(bad) == 1 and 'counting failed on aten.addmm' in bad[0] and 'shape not understood' in bad[0]
    assert 'FLOP/s' not in learn.simple_profile_results
    e = learn.simple_profile_efficiency
    assert e['forward_flops_per_sample'] is None and e['mfu'] is None and 'aten.addmm' in e['flops_note']
    no_leftovers(learn)

class Square(torch.autograd.Function):
    "A custom autograd Function whose backward does a matmul"
    @staticmethod
    def forward(ctx, x): ctx.save_for_backward(x); return x*x
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return 2*x*(g @ torch.eye(g.shape[1]))

class SquareLayer(nn.Module):
    def forward(self, x): return Square.apply(x)

def test_custom_autograd_function():
    learn = learner(model=mlp(extra=[SquareLayer()]))
    profiled(learn).fit(1)
    e = learn.simple_profile_efficiency
    assert e['forward_flops_per_sample'] == FWD and e['backward_flops_per_sample'] == BWD + 2*H1*H1
    no_leftovers(learn)

def test_nothing_counted_one_line():
    learn = synth_learner(n_trn=8, n_val=2)  # y = a*x + b: elementwise, nothing torch's counter knows
    profiled(learn).fit(1)
    lines = learn.simple_profile_report.section('Efficiency').lines
    assert sum(l.startswith('FLOPs:') for l in lines) == 1 and 'none counted' in lines[0]
    assert 'FLOP/s' not in learn.simple_profile_results

def test_warmup_zero_not_counted():
    learn = learner()
    profiled(learn, warmup=0).fit(1)
    assert learn.simple_profile_efficiency['flops_note'].startswith('not counted: `warmup=0`')
    assert 'FLOP/s' not in learn.simple_profile_results

@pytest.mark.parametrize('event,exc', [('after_pred', RuntimeError), ('after_backward', KeyboardInterrupt)])
def test_crash_inside_counted_batch(event, exc):
    "An exception inside the counted batch: counting stops, the shadow goes, the learner is as before; the next fit is plain"
    class Crash(Callback):
        order = 0
        def __init__(self): self.armed = True
    def crash(self):
        if self.armed and self.training: self.armed = False; raise exc('boom')
    setattr(Crash, event, crash)
    plain = learner(cbs=Crash())
    with pytest.raises(exc): plain.fit(1)
    learn = learner(cbs=Crash())
    cbs0 = list(learn.cbs)
    profiled(learn)
    with pytest.raises(exc): learn.fit(1)
    no_leftovers(learn)
    assert list(learn.cbs) == cbs0 and set(learn.__dict__) - set(plain.__dict__) == {'simple_profile'}
    assert learn.simple_profile.interrupted.startswith(exc.__name__)
    learn.fit(1)  # plain fastai again
    assert _get_current_dispatch_mode() is None

def test_cancelled_first_batch_counts_the_next_warmup():
    "A CancelBatchException before the forward ends: nothing counted there; the next epoch's warm-up batch counts"
    class Cancel(Callback):
        order = 0
        def after_pred(self):
            if self.training and self.epoch == 0 and self.iter == 0: raise CancelBatchException()
    learn = learner(cbs=Cancel())
    profiled(learn).fit(2)
    e = learn.simple_profile_efficiency
    assert e['forward_flops_per_sample'] == FWD and e['backward_flops_per_sample'] == BWD
    no_leftovers(learn)

def _dynamo_frames():
    from torch._dynamo.utils import counters
    return counters['frames']['ok']

def test_compiled_model_counted_after_it_compiled():
    "A compiled model compiles in the first epoch's warm-up batch as usual, and is counted in the second epoch's"
    torch._dynamo.reset()
    compiled_in = {}
    class Probe(Callback):
        order = -2000  # around everything else in the batch
        def before_batch(self): self.f0 = _dynamo_frames()
        def after_batch(self):
            if _dynamo_frames() > self.f0: compiled_in[(self.epoch, self.training, self.iter)] = True
    learn = learner(n=256, model=torch.compile(mlp(), backend='eager'), cbs=Probe())  # full batches: no recompile for a shape
    profiled(learn).fit(2)
    # it compiled, in the warm-up batches of the first epoch (training, then evaluation mode), not in the statistics
    assert set(compiled_in) == {(0, True, 0), (0, False, 0)}, compiled_in
    e = learn.simple_profile_efficiency
    assert e['forward_flops_per_sample'] == FWD and e['backward_flops_per_sample'] == BWD and e['predict_flops_per_sample'] == FWD
    learn = learner(n=160, model=torch.compile(mlp(), backend='eager'))
    profiled(learn).fit(1)
    assert 'the model is compiled' in learn.simple_profile_efficiency['flops_note']
    no_leftovers(learn)

def test_compiled_function_inside_the_model_still_compiles():
    "An undetectable compiled function inside forward: the counted batch runs it eagerly, it compiles at its next call"
    torch._dynamo.reset()
    @torch.compile(backend='eager')
    def act(x): return torch.relu(x)*2
    class Act(nn.Module):
        def forward(self, x): return act(x)
    learn = learner(n=160, model=mlp(extra=[Act()]))
    before = _dynamo_frames()
    profiled(learn).fit(1)
    assert _dynamo_frames() > before
    assert learn.simple_profile_efficiency['forward_flops_per_sample'] == FWD

def test_hand_added_and_pickled():
    cb = EfficiencyProbe()
    learn = learner(cbs=cb)
    learn.fit(1)
    assert cb.result.flops_per_sample()['forward'] == FWD
    learn.remove_cb(cb)
    learn = learner()
    profiled(learn).fit(1)
    back = pickle.loads(pickle.dumps(learn.simple_profile))
    assert back.facts.efficiency.flops_per_sample() == learn.simple_profile.facts.efficiency.flops_per_sample()

def test_bad_input():
    with pytest.raises(ValueError, match='`peak_flops` must be a number > 0'): learner().profile(peak_flops=-1)
    with pytest.raises(TypeError, match='`peak_flops` must be a number'): learner().profile(peak_flops='fast')
    with pytest.raises(ValueError, match="`efficiency` must be one of 'auto', True, False"): learner().profile(efficiency='yes')
    with pytest.raises(TypeError, match='`warmup` must be an int'): EfficiencyProbe(warmup=1.5)

# ---- the CUDA memory path, on a stand-in (no GPU here) ----

def _bind(real, *args, **kwargs): inspect.signature(real).bind(*args, **kwargs)

class FakeCudaMemory:
    "torch.cuda's memory API with its signatures, over a simulated caching allocator: `alloc`/`free` move the counters"
    def __init__(self, name='NVIDIA H100 80GB HBM3', total=80*2**30, free=60*2**30, reserved=2*2**30, base=10**9):
        self.name,self.total,self.free_bytes,self.reserved = name,total,free,reserved
        self.allocated = self.peak = base
        self.calls = []
    def alloc(self, n): self.allocated += n; self.peak = max(self.peak, self.allocated)
    def free(self, n): self.allocated -= n
    def memory_allocated(self, device=None):
        _bind(torch.cuda.memory_allocated, device); self.calls.append('memory_allocated'); return self.allocated
    def max_memory_allocated(self, device=None):
        _bind(torch.cuda.max_memory_allocated, device); self.calls.append('max_memory_allocated'); return self.peak
    def reset_peak_memory_stats(self, device=None):
        _bind(torch.cuda.reset_peak_memory_stats, device); self.calls.append('reset'); self.peak = self.allocated
    def mem_get_info(self, device=None):
        _bind(torch.cuda.mem_get_info, device); return (self.free_bytes, self.total)
    def memory_reserved(self, device=None):
        _bind(torch.cuda.memory_reserved, device); return self.reserved
    def get_device_name(self, device=None):
        _bind(torch.cuda.get_device_name, device); return self.name

ACT,TMP,STEP = 4000,1000,7*10**6  # bytes per sample held from forward to backward, per sample during backward, and per step

def allocating_model(fake):
    class Act(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.n = len(x); fake.alloc(ACT*ctx.n); return x.clone()
        @staticmethod
        def backward(ctx, g):
            fake.alloc(TMP*ctx.n); fake.free((ACT+TMP)*ctx.n); return g
    class ActLayer(nn.Module):
        def forward(self, x): return Act.apply(x) if torch.is_grad_enabled() else x
    return mlp(extra=[ActLayer()])

class StepAlloc(Callback):
    order = 995  # after the efficiency callback (990): allocated after its reset, freed after its read
    def __init__(self, fake): self.fake = fake
    def before_step(self): self.fake.alloc(STEP)
    def after_step(self): self.fake.free(STEP)

def test_cuda_memory_peaks_on_a_stand_in():
    fake = FakeCudaMemory()
    learn = learner(model=allocating_model(fake), cbs=StepAlloc(fake))
    cb = EfficiencyProbe(cuda_api=fake)
    learn.add_cb(cb)
    learn.fit(3)
    r,base = cb.result,10**9
    facts = Facts(); cb.contribute(facts)  # what the call's end gives its facts (the callback drove itself: added by hand)
    assert r.device_name == 'NVIDIA H100 80GB HBM3' and r.sampled == 3  # the warm-up batch of each epoch
    assert r.memory == {'forward': base + 32*ACT, 'backward': base + 32*(ACT+TMP), 'opt_step': base + STEP}
    assert r.memory_base == base
    assert fake.calls.count('reset') == 3*3 and fake.calls.count('max_memory_allocated') == 3*3  # sampled batches only
    assert r.device_total == 80*2**30 and r.device_usable == 62*2**30
    assert math.isclose(r.batch_growth(), (.9*62*2**30 - base)/STEP)  # the largest phase peak: opt_step
    # the table's peak for what ran (fp32 on the CPU tensors here: the stand-in only renames the device)
    assert r.peak() == (67e12, 'table')
    learn.remove_cb(cb)

def test_cuda_path_in_a_profiled_call_and_the_section():
    fake = FakeCudaMemory()
    learn = learner(model=allocating_model(fake), cbs=StepAlloc(fake))
    profiled(learn)
    eff_cb = first(c for c in learn.cbs if isinstance(c, EfficiencyProbe))
    eff_cb.cuda_api = fake  # what `profile()` picks on a GPU: `torch.cuda`
    learn.fit(2)
    e = learn.simple_profile_efficiency
    assert e['peak_flops'] == 67e12 and e['peak_source'] == 'table' and 0 < e['mfu'] < 1
    assert set(e['peak_memory']) == {'forward','backward','opt_step'}
    assert e['memory_headroom'] == 62*2**30 - max(e['peak_memory'].values())
    lines = learn.simple_profile_report.section('Efficiency').lines
    assert any(l.startswith('Peak memory (CUDA, allocated; 2 warm-up batches sampled)') and 'the batch size could grow' in l for l in lines)
    assert any('NVIDIA H100 80GB HBM3, fp32 peak' in l for l in lines)
    no_leftovers(learn)

def test_cuda_step_cancelled_no_opt_step_reading():
    "A callback that cancels the step before ours resets (gradient accumulation does): no opt_step peak from that batch"
    class SkipStep(Callback):
        order = 0
        def before_step(self): raise CancelStepException()
    fake = FakeCudaMemory()
    learn = learner(model=allocating_model(fake), cbs=[SkipStep(), StepAlloc(fake)])
    cb = EfficiencyProbe(cuda_api=fake)
    learn.add_cb(cb)
    learn.fit(1)
    assert set(cb.result.memory) == {'forward', 'backward'} and cb.result.sampled == 1
    learn.remove_cb(cb)

def test_cuda_memory_failure_warns_and_training_goes_on(monkeypatch):
    class Broken(FakeCudaMemory):
        def max_memory_allocated(self, device=None): raise RuntimeError('CUDA error: device lost')
    monkeypatch.setenv('FASTPROFILE_STRICT', '0')
    learn = learner()
    cb = EfficiencyProbe(cuda_api=Broken())
    learn.add_cb(cb)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always'); learn.fit(2)
    assert sum('sampling CUDA memory failed' in str(x.message) for x in w) == 1
    assert cb.result.memory == {} and cb.result.flops_per_sample()['forward'] == FWD

# ---- the advice, on a synthetic GPU run ----

def _gpu_result(dtype_flops, families, growth_usable=40*2**30, channels_last=False, costs=None):
    clock = FakeClock()
    rec = ProfileRecord(warmup=1, clock=clock)
    drive_record(rec, clock, n_epochs=2, n_train=6, n_valid=2, bs=64, cost=costs)
    eff = Efficiency(device='cuda:0', device_name='NVIDIA H100 80GB HBM3', channels_last=channels_last,
                     memory={'forward': 3*2**30, 'backward': 4*2**30, 'opt_step': 3*2**30}, memory_base=2*2**30,
                     sampled=2, device_total=80*2**30, device_usable=growth_usable)
    eff.stages.append(StageFlops(forward=1e9, backward=2e9, batch_size=64, dtypes=dtype_flops, families=families, train_batches=12))
    return ProfileResult(rec, Facts(device='cuda:0', batch_size=64, flops=eff.row_flops(), efficiency=eff))

def test_advice_low_mfu_compute_bound():
    res = _gpu_result({'fp32': 3e9*64}, {'conv': 2.5e9*64, 'matmul': .5e9*64})
    s = efficiency_summary(res)
    assert s['mfu'] < LOW_MFU and _compute_share(res.record) > .5
    adv = efficiency_advice(res)
    assert adv[0].startswith('MFU ') and 'compute-bound' in adv[0]
    assert any('to_fp16()' in l and '15x' in l for l in adv)  # 989.5 / 67
    assert any('larger batch, bs 256 (4x the batch of 64; memory allows up to ~' in l for l in adv)  # a size to try, not memory's multiplier
    assert any('channels_last' in l for l in adv)
    assert adv == [l for l in efficiency_lines(res) if l in adv]  # the section carries them
    # already half precision, channels_last, memory full: only what is left
    res = _gpu_result({'bf16': 3e9*64}, {'conv': 3e9*64}, growth_usable=int(4.2*2**30), channels_last=True)
    adv = efficiency_advice(res)
    assert len(adv) == 1 and 'compute-bound' in adv[0]
    # the diagnosis says it is not compute-bound: the advice says so instead
    adv = efficiency_advice(_gpu_result({'fp32': 3e9*64}, {'matmul': 3e9*64}), compute_bound=False)
    assert len(adv) == 1 and 'not compute-bound' in adv[0]
    assert efficiency_advice(res, compute_bound=True) == efficiency_advice(res)

def test_row_flops_use_gpu_time_where_longer():
    res = pd.DataFrame({'Phase':['train','train'], 'Action':['batch','batch'], 'Step':['forward','backward'],
                        'Samples/Second':[100., 100.], 'Total Time':[1., 2.], 'GPU Total Time':[4., np.nan]})
    got = row_flops_per_second(res, {('train','batch','forward'): 10., ('train','batch','backward'): 10.})
    assert got == [10*100*1/4, 10*100*2/2]

# ---- the loggers' helpers ----

def test_scalars_for_sinks():
    "A sink's numbers come through the probes' protocol: `LiveScalars` while training, `probe_scalars` after the call"
    logged = []
    class Capture(Sink):
        name = 'capture'
        def before_call(self, s): self.live = LiveScalars(s.probes)  # the probes' numbers while training: FLOP/s once counted
        def log_batch(self, record, step, window):
            rates = train_samples_per_second(record, window)
            logged.append((rates, self.live(rates)))
    learn = learner(n=256)
    profiled(learn, logger_callback=Capture(), log_every=2, peak_flops=1e12).fit(1)
    rates,sc = logged[-1]
    assert math.isclose(sc['flops_per_second/train_forward'], FWD*rates['forward'])
    assert math.isclose(sc['flops_per_second/train_batch'], (FWD+BWD)*rates['batch'])
    assert math.isclose(sc['mfu/train_batch'], sc['flops_per_second/train_batch']/1e12)
    fit = efficiency_fit_scalars(learn.simple_profile)
    assert fit['flops_per_sample/forward'] == FWD and 0 < fit['mfu/fit'] < 1
    assert fit['flops_per_second/fit'] == learn.simple_profile_efficiency['train_flops_per_second']
    assert {k:v for k,v in probe_scalars(learn.simple_profile).items() if k in fit} == fit  # as the sinks log it
    assert efficiency_scalars(None, {'forward': 1.}) == {}  # efficiency off: nothing

def test_the_diagnosis_uses_the_measurements():
    "A compute-bound GPU run far below its peak: the report's Diagnosis names the measured fixes, the Efficiency section does not repeat them"
    from fastprofile.learner import SECTIONS
    res = _gpu_result({'fp32': 3e9*64}, {'conv': 2.5e9*64, 'matmul': .5e9*64})
    res = ProfileResult(res.record, res.facts, sections=SECTIONS)
    d,e = res.report.section('Diagnosis'),res.report.section('Efficiency')
    assert d.data.verdict == 'compute'
    fix = d.data.knob  # in full in the evidence; the verdict's line says the first thing to paste
    assert fix.startswith('MFU 4.7%') and 'to_fp16()' in fix and 'bs 256 (4x the batch of 64' in fix and 'channels_last' in fix
    assert fix in '\n'.join(d.more) and next(l for l in d.lines if l.startswith('Fix: ')).startswith('Fix: `learn.to_fp16()`')
    assert not any('Try ' in l for l in e.lines) and any(l.startswith('MFU: 4.7%') for l in e.lines)
    # no efficiency measured: the diagnosis' own fix, unchanged
    plain = ProfileResult(res.record, Facts(device='cuda:0', batch_size=64), sections=SECTIONS)
    assert plain.report.section('Efficiency') is None
    assert next(l for l in plain.report.section('Diagnosis').lines if l.startswith('Fix: ')).startswith('Fix: `learn.to_fp16()`')

@pytest.mark.parametrize('compute', [True, False], ids=['fix-given', 'no-fix'])
def test_the_report_diagnoses_the_run_once(compute, monkeypatch):
    "Building the report with efficiency measured diagnoses the run once (the Efficiency section reads whether the Diagnosis gave the fix), with the same sections as diagnosing again"
    import fastprofile.analysis.diagnosis as fdiag, fastprofile.probes.efficiency.report as feff
    from fastprofile.learner import SECTIONS
    made = lambda: _gpu_result({'fp32': 3e9*64}, {'conv': 2.5e9*64, 'matmul': .5e9*64} if compute else {'matmul': 3e9*64})
    want = ProfileResult(made().record, made().facts, sections=SECTIONS)
    fdiag.diagnose(want)  # what the report's Diagnosis section does before the Efficiency section
    want_e = feff.efficiency_section(want)
    calls,real = [],fdiag.diagnose
    def counted(*a, **k): calls.append(1); return real(*a, **k)
    monkeypatch.setattr(fdiag, 'diagnose', counted)
    res = ProfileResult(made().record, made().facts, sections=SECTIONS)
    e = res.report.section('Efficiency')
    assert len(calls) == 1
    assert e.lines == want_e.lines
    # built alone, where no diagnosis of the run said it, the section gives the advice itself (and diagnoses nothing)
    r = ProfileResult(made().record, made().facts, sections=[])
    alone = feff.efficiency_section(r)
    assert len(calls) == 1 and alone.lines == feff.efficiency_lines(r, advice=True), alone.lines
    if compute: assert any(l.startswith('Try ') for l in alone.lines) and not any(l.startswith('Try ') for l in e.lines)

