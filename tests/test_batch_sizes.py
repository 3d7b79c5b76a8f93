"The batch-size model (`fastprofile.probes.batch_sizes`, the diagnosis' per-batch finding): measured on the learner without changing it, priced through the pipeline model, applied by `check_advice` and `tune`"
import json, math, random, re, warnings
import numpy as np, pytest, torch
from torch import nn
from fastai.basics import *
from fastai.callback.progress import ProgressCallback
from fastai.test_utils import synth_learner
from fastprofile.learner import *
from fastprofile.engine.core import Facts, ProfileResult
from fastprofile.analysis.diagnosis import diagnose, FASTAI_TFMS
from fastprofile.fixes.advice import check_advice
from fastprofile.sinks.saving import load_profile
from fastprofile.probes.batch_sizes import BatchSizes, BatchSizesProbe, Measurement, budget_for, BUDGET, REPS
from bench.batch import tabular

@pytest.fixture
def time_to_measure(monkeypatch):
    "A measurement budget no busy machine runs out of (5-10 s): the tests below need the sizes measured to prove anything"
    import fastprofile.probes.batch_sizes as bsm
    monkeypatch.setattr(bsm, 'BUDGET', (5., .03, 10.))

class Stateful(nn.Module):
    "BatchNorm (running statistics), dropout (random numbers) and a plain attribute set in forward, as an RNN keeps its hidden state"
    def __init__(self):
        super().__init__()
        self.lin,self.bn,self.drop,self.out = nn.Linear(4, 16),nn.BatchNorm1d(16),nn.Dropout(.5),nn.Linear(16, 1)
        self.calls,self.last_bs = 0,None
    def forward(self, x):
        self.calls += 1; self.last_bs = x.shape[0]
        return self.out(self.drop(self.bn(self.lin(x))))

def stateful_learner(n=512, bs=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g); y = x.sum(1, keepdim=True)
    items = list(zip(x, y))
    dls = DataLoaders.from_dsets(items[:n*3//4], items[n*3//4:], bs=bs, num_workers=0)
    learn = Learner(dls, Stateful(), loss_func=MSELossFlat())
    learn.remove_cbs(learn._grab_cbs(ProgressCallback))
    learn.logger = noop
    return learn

def _state(learn):
    "Everything measuring could change: weights, buffers, gradients, modes, plain attributes, random states, the loaders' RNGs"
    m = learn.model
    return dict(sd={k:v.clone() for k,v in m.state_dict().items()}, grads=[None if p.grad is None else p.grad.clone() for p in m.parameters()],
                modes=[x.training for x in m.modules()], attrs=(m.calls, m.last_bs), py=random.getstate(), np=np.random.get_state()[1].copy(),
                torch=torch.get_rng_state().clone(), dl=[dl.rng.getstate() for dl in learn.dls.loaders], bs=[dl.bs for dl in learn.dls.loaders])

def _same(a, b):
    for k in ('modes','attrs','py','dl','bs'): assert a[k] == b[k], k
    assert all(torch.equal(a['sd'][k], b['sd'][k]) for k in a['sd'])
    assert all((x is None) == (y is None) and (x is None or torch.equal(x, y)) for x,y in zip(a['grads'], b['grads']))
    assert np.array_equal(a['np'], b['np']) and torch.equal(a['torch'], b['torch'])

def test_measuring_leaves_the_learner_as_it_was(time_to_measure):
    learn = stateful_learner()
    learn.profile(logger_callback=None, show_report=False).fit(1)
    sc = learn.simple_profile.facts.batch_sizes
    assert isinstance(sc, BatchSizes) and sc._pending is not None and not sc.measured  # lazy: nothing measured yet
    learn.model.train()  # a mode other than the one the fit left, to see it kept
    before = _state(learn)
    sc.ensure(fit=10.)
    assert sc.measured and sc.sizes[:2] == [16, 32] and sc._pending is None, sc
    assert all(t > 0 for t in sc.train + sc.valid) and sc.items == 384 and sc.reps == REPS
    _same(before, _state(learn))
    calls = learn.model.calls
    sc.ensure(fit=10.)  # once only
    assert learn.model.calls == calls

def test_the_fit_is_not_changed_by_the_probe(time_to_measure):
    "Two fits from one seed, profiled (the report measures the batch sizes) and not: the same weights"
    def run(profiled):
        set_seed(0, reproducible=True)
        learn = stateful_learner()
        if profiled: learn.profile(logger_callback=None, plain=True)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            learn.fit(2, lr=1e-2)
        if profiled: assert learn.simple_profile.facts.batch_sizes.measured  # the report asked for it
        return {k:v.clone() for k,v in learn.model.state_dict().items()}, torch.get_rng_state()
    (a,ra),(b,rb) = run(False),run(True)
    assert all(torch.equal(a[k], b[k]) for k in a) and torch.equal(ra, rb)

def test_sizes_capped_by_the_training_set_and_memory():
    learn = stateful_learner(n=512, bs=16)  # 384 training samples: at least 4 batches an epoch allows up to bs 96
    m = Measurement(learn, 16)
    assert m.sizes() == ([16, 32, 64], "bs 128 and larger not measured: the training set (384 samples) would hold fewer than 4 batches")
    m.growth = 2.5
    assert m.sizes() == ([16, 32], "bs 64 and larger not measured: memory allows ~2.5x the batch")
    assert budget_for(1.) == max(BUDGET[0], BUDGET[1]) and budget_for(1e4) == BUDGET[2] and budget_for(20.) == pytest.approx(BUDGET[1]*20)

def test_what_cannot_be_measured_says_why():
    learn = stateful_learner()
    learn.model = torch.compile(learn.model)
    learn.profile(logger_callback=None, show_report=False, layers=False).fit(1)
    sc = learn.simple_profile.facts.batch_sizes
    assert not sc.measured and 'compiled' in sc.failure
    assert 'compiled' in diagnose(learn).basis  # the report says it was not measured, and why

def test_json_round_trip_field_by_field(tmp_path, time_to_measure):
    learn = stateful_learner()
    learn.profile(logger_callback=None, show_report=False).fit(1)
    res = learn.simple_profile
    sc = res.facts.batch_sizes
    res.save(tmp_path/'p.json')  # saving measures it (the learner is there), then writes the numbers
    back = load_profile(tmp_path/'p.json').facts.batch_sizes
    assert sc.measured and isinstance(back, BatchSizes)
    for f in ('sizes','train','valid','draw','reps','items','seconds','stopped','failure'): assert getattr(back, f) == getattr(sc, f), f

def test_tabular_per_batch_work_is_priced_measured(time_to_measure):
    "fastai's tabular learner at bs 64: per-batch work dominates the step (5-6x faster per sample at bs 512, measured): the diagnosis names a larger batch with a measured prediction, and never advises moving fastai's own `ReadTabBatch`"
    learn = tabular(64)
    with learn.no_bar(), learn.no_logging(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn.profile(logger_callback=None, show_report=False).fit(1)
    d = diagnose(learn)
    f = next(f for f in d.findings if f.resource == 'per_batch')
    assert f.kind == 'model' and f.change['kind'] == 'batch_size' and f.change['value'] >= 128, f
    assert f.speedup > 1.5, f  # the premise measured here: 5-6x at 8x the batch, 1.9x at twice (a busy machine may leave time for 2x only)
    assert 'retune the learning rate' in f.fix
    got = d.numbers['batch_sizes']  # what was measured, and the model's speedup at each larger size (`Probe.numbers`)
    assert got['sizes'][0] == 64 and f.change['value'] in got['predicted'] and got['predicted'][f.change['value']] == pytest.approx(f.speedup)
    said = [g for g in d.findings if 'ReadTabBatch' in (g.fix or '')]
    assert said, [g.fix for g in d.findings]  # timed on the sampled batches: the batch transforms' finding speaks of it
    for g in said: assert "fastai's own" in g.fix and 'cannot be moved' in g.fix and g.change is None, g.fix
    assert not any('SaveModelCallback' in (g.fix or '') for g in d.findings)  # a callback the learner does not have

def test_check_advice_applies_the_batch_size_per_sample(time_to_measure):
    learn = tabular(64)
    with learn.no_bar(), learn.no_logging(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn.profile(logger_callback=None, show_report=False).fit(1)
        c = check_advice(learn, resource='per_batch')
    assert c.change['kind'] == 'batch_size' and c.unit == 'sample' and 'per sample' in c.summary()
    assert c.measured > 1.5 and c.predicted > 1.5, c.summary()  # premise: 5-6x at 8x the batch, 1.9x at twice
    assert [dl.bs for dl in learn.dls.loaders] == [64, 64]  # put back

def test_tune_tries_the_diagnosis_batch_size():
    from fastprofile.fixes.tune import candidates
    from fastprofile.engine.record import ProfileRecord
    from fastprofile.testing import FakeClock, drive_record
    clock = FakeClock()
    rec = drive_record(ProfileRecord(warmup=0, clock=clock), clock, n_train=10, n_valid=0,
                       cost=dict(draw=.002, forward=.0005, backward=.0005, opt_step=.001, loss=0, zero_grad=0, gap=0, phase_other=0, fit_other=0))
    sc = BatchSizes([8, 16, 32, 64], train=[1e-3, 1.2e-3, 1.6e-3, 2.4e-3], valid=[5e-4]*4, draw=[2e-3, 2.2e-3, 2.6e-3, 3.4e-3], reps=3, items=6400)
    d = diagnose(rec, Facts(num_workers=0, threads=1, cpus=1, batch_size=8, batch_sizes=sc))
    learn = stateful_learner()
    c = next(c for c in candidates(learn, d) if c.kind == 'batch_size')
    assert c.value == 64 and c.predicted == pytest.approx(d.predicted_speedup)

def test_fastai_transforms_are_listed_with_what_the_user_can_do():
    assert set(FASTAI_TFMS) >= {'ReadTabBatch', 'IntToFloatTensor'}
    assert all('larger batch' in v or 'smaller images' in v for v in FASTAI_TFMS.values())

def test_batch_sizes_false_leaves_the_probe_out():
    "`learn.profile(batch_sizes=False)`: nothing measured after the fit, and the diagnosis prices no measured batch size"
    learn = stateful_learner()
    learn.profile(logger_callback=None, show_report=False, batch_sizes=False).fit(1)
    f = learn.simple_profile.facts
    assert f.batch_sizes is None and 'batch_sizes' not in f.extra
    d = diagnose(learn)
    assert 'batch_sizes' not in d.numbers and not any(g.resource == 'per_batch' for g in d.findings)
    with pytest.raises(TypeError, match='batch_sizes. must be True or False'): learn.profile(batch_sizes='yes')

def test_the_cost_line_names_the_batch_measurement(time_to_measure):
    "Every cost the profiler adds is in its cost line: the batch sizes timed after the fit, with what they took"
    learn = synth_learner(n_trn=10)
    learn.profile(logger_callback=None, show_report=False).fit(1)
    res = learn.simple_profile
    notes = ' '.join(res.report.notes)  # the report reads the diagnosis first: the sizes are measured, then the notes say so
    sc = res.facts.batch_sizes
    assert sc.measured and sc.seconds > 0
    assert re.search(r"Profiler's cost: .*; [\d.]+ (ms|s) timing batch sizes after the fit\.", notes), notes
