"""The callback and metric costs carry their spread too (issue 39): the sampler's (`SampledCosts`) and the breakdown's
(`Breakdown`), per (phase, callback) and per event, and each part of the draw, checked on real learners against what the
callback or transform timed itself; their JSON and pickles carry every field, and files without the spreads still load"""
import json, math, pickle, statistics, time
import numpy as np, pytest, torch
from fastai.basics import *
from fastai.callback.all import *
from fastai.test_utils import synth_learner, synth_dbunch
from fasttransform import Transform
from fastprofile.all import *
from fastprofile.probes.callback_costs import CallbackCostsProbe, SampledCosts, mean_spread
from fastprofile.probes.breakdown import BreakdownProbe, Breakdown

QUIET = dict(show_report=False, logger_callback=None)
SLEEP = .008  # what `Uneven` and `Alternating` sleep every other batch

class Uneven(Callback):
    "Sleeps `SLEEP` after odd training batches, not after even ones; keeps its own time of each training `after_batch`, and whether a stand-in was on it"
    def __init__(self): self.seen = []
    def after_batch(self):
        if not self.training: return
        t = time.perf_counter()
        if self.train_iter % 2: time.sleep(SLEEP)
        self.seen.append((time.perf_counter() - t, 'after_batch' in self.__dict__))  # the sampler's stand-in is an instance attribute

class Alternating(Transform):
    "A batch transform that sleeps `SLEEP` on every other call; keeps its own time of each"
    def __init__(self): super().__init__(); self.calls,self.seen = 0,[]
    def __call__(self, b, **kwargs):
        t = time.perf_counter()
        self.calls += 1
        if self.calls % 2: time.sleep(SLEEP)
        self.seen.append(time.perf_counter() - t)
        return b

def learner(n_trn=40):
    "A regression learner on `n_trn` training batches with `Uneven` after each batch and `Alternating` in the training loader's `after_batch`"
    dls = synth_dbunch(n_train=n_trn, n_valid=2)
    dls.device = torch.device('cpu')
    tfm = Alternating()
    dls.train.after_batch.add(tfm)
    learn = synth_learner(data=dls, cbs=Uneven())
    learn.remove_cb(ProgressCallback); learn.logger = noop
    return learn,learn.cbs.filter(lambda c: isinstance(c, Uneven))[0],tfm

def near(got, want):
    "`got` within 5% and 0.2 ms of `want`: what a stand-in adds around a callback (a few µs), with room for a busy machine"
    assert abs(got - want) <= .05*want + 2e-4, (got, want)

def _spread_of(xs): return mean_spread(sum(xs), sum(x*x for x in xs), len(xs))

def test_sampled_costs_spread_on_a_real_learner():
    "The sampler's spread of a callback that sleeps 8 ms every other batch: what its own times on the sampled batches give; the lines show it"
    learn,cb,tfm = learner()
    learn.profile(**QUIET).fit(1)
    c = learn.simple_profile.facts.callback_costs
    test_eq(c.batches['train'], 3)  # 39 batches past the warm-up: 1 and 2 (one in 16), then 33
    own = [dt for dt,timed in cb.seen if timed]
    test_eq(len(own), 3)
    assert max(own) >= SLEEP and min(own) < SLEEP/10  # the premise: batches 1 and 2, one with the sleep, one without
    near(c.spread('train', 'Uneven', 'after_batch'), _spread_of(own))
    test_eq(c.spread('train', 'Uneven'), c.spread('train', 'Uneven', 'after_batch'))  # its only timed event
    assert math.isnan(c.spread('valid', 'Uneven'))  # one valid batch sampled: no spread
    row = c.callback_costs().set_index(['phase','name','event']).loc[('train','Uneven','after_batch')]
    test_eq(row.spread, c.spread('train', 'Uneven', 'after_batch'))
    line = next(l for l in c.lines(20) if l.startswith('Uneven.after_batch (train)'))
    assert ' ±' in line and line.endswith('per batch (3 sampled)'), line
    sp = c.draw_spread('train')
    test_eq(set(sp), set(c.draw_parts('train')))
    assert sp['Alternating'] > SLEEP/4  # draws 1 and 2: one sleeps, one does not (a spread of ≥ 4 ms)
    assert ' ±' in next(l for l in c.lines(20) if l.startswith('train draw'))

def test_breakdown_spread_on_a_real_learner():
    "The breakdown times every batch: the spread of the callback and of the transform is what their own times over the 40 batches give"
    learn,cb,tfm = learner()
    learn.profile(breakdown=True, **QUIET).fit(1)
    b = learn.simple_profile.facts.breakdown
    test_eq(b.batches['train'], 40)
    own = [dt for dt,_ in cb.seen]
    test_eq(len(own), 40)
    near(b.spread('train', 'Uneven', 'after_batch'), _spread_of(own))
    test_eq(b.spread('train', 'Uneven'), b.spread('train', 'Uneven', 'after_batch'))
    near(b.draw_spread('train')['Alternating'], _spread_of(tfm.seen))
    assert math.isnan(b.spread('fit', 'Recorder', 'before_fit'))  # between batches: no spread per batch
    assert ' ±' in b.lines()[0] and any(l.startswith('Uneven.after_batch (train): ') and ' ±' in l for l in b.lines(20))

def test_spreads_are_two_standard_errors_of_the_mean():
    "Fed known seconds, both give 2·s/√n of them (`s` their standard deviation; 0 where an event did not run; a callback's events added up)"
    xs,ys = [.001, .004, .002, .007],[.003, 0., .001, .002]  # a callback's `after_batch` and `before_batch` in 4 batches (no `before_batch` in the second)
    se = lambda vs: 2*statistics.stdev(vs)/math.sqrt(len(vs))
    c,b = SampledCosts(),Breakdown()
    for x,y in zip(xs, ys):
        ev = {('Cb','after_batch'): x} | ({('Cb','before_batch'): y} if y else {})
        c._add_sample('train', ev | {('Cb','before_draw'): .5}); c._add_draw('train', {'copy': y, 'Tfm': x})
        b._count_batch('train'); b._add_draw('train', x, {'copy': y})
        for (n,e),dt in ev.items(): b._add_cost('train', n, e, dt)
        b._add_batch({('train',n,e):dt for (n,e),dt in ev.items()})
    for got in (c, b):
        test_close(got.spread('train', 'Cb', 'after_batch'), se(xs), eps=1e-12)
        test_close(got.spread('train', 'Cb', 'before_batch'), se(ys), eps=1e-12)
        test_close(got.spread('train', 'Cb'), se([x + y for x,y in zip(xs, ys)]), eps=1e-12)  # `before_draw` (between batches) left out
        test_eq(got.callback_costs().set_index('event').spread['after_batch'], got.spread('train', 'Cb', 'after_batch'))
    test_close(c.draw_spread('train')['Tfm'], se(xs), eps=1e-12); test_close(c.draw_spread('train')['copy'], se(ys), eps=1e-12)
    test_close(b.draw_spread('train')['wait'], se(xs), eps=1e-12); test_close(b.draw_spread('train')['copy'], se(ys), eps=1e-12)
    assert math.isnan(mean_spread(.1, .01, 1))  # one batch: no spread

def same(a, b, path='') -> None:
    "Assert that `a` and `b` are equal field by field: their attributes, dicts, lists, arrays and floats (NaN equal to NaN), and types"
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (path, type(a), type(b))
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a: same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i,(x,y) in enumerate(zip(a, b)): same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray): assert np.array_equal(a, b), path
    elif isinstance(a, float): assert a == b or (a != a and b != b), (path, a, b)
    elif hasattr(a, '__dict__'): same(vars(a), vars(b), path)
    else: assert a == b, (path, a, b)

def _json(cls, v): return cls.from_json(json.loads(json.dumps(cls.to_json(v), allow_nan=False)))

@pytest.mark.parametrize('breakdown', [False, True])
def test_json_and_pickle_carry_every_field(breakdown):
    "A saved profile's costs read back equal to what was measured, every attribute (sums of squares included); so does a pickle"
    learn,cb,tfm = learner(n_trn=20)
    learn.profile(breakdown=breakdown, **QUIET).fit(1)
    f = learn.simple_profile.facts
    v,cls = (f.breakdown,BreakdownProbe) if breakdown else (f.callback_costs,CallbackCostsProbe)
    assert v.squares and v.callback_squares and (breakdown or v.draw_squares)  # there is something to carry
    same(_json(cls, v), v)
    same(pickle.loads(pickle.dumps(v)), v)
    test_eq(_json(cls, v).lines(20), v.lines(20))
    test_eq(_json(cls, v).callback_costs(), v.callback_costs())

@pytest.mark.parametrize('breakdown', [False, True])
def test_files_and_pickles_without_spreads_still_load(breakdown):
    "Costs saved or pickled by fastprofile 0.2 or older (no squares) load: their spreads are NaN, their lines show none"
    learn,cb,tfm = learner(n_trn=20)
    learn.profile(breakdown=breakdown, **QUIET).fit(1)
    f = learn.simple_profile.facts
    v,cls = (f.breakdown,BreakdownProbe) if breakdown else (f.callback_costs,CallbackCostsProbe)
    d = cls.to_json(v)
    for k in ('squares','callback_squares','draw_squares'): d.pop(k, None)
    old = cls.from_json(d)
    assert math.isnan(old.spread('train', 'Uneven')) and math.isnan(old.spread('train', 'Uneven', 'after_batch'))
    test_eq(old.callback_costs().per_batch, v.callback_costs().per_batch)
    assert not any(' ±' in l for l in old.lines(20) if 'draw' not in l)  # (the breakdown's draw stats were always saved whole)
    for k in ('squares','callback_squares','draw_squares'): v.__dict__.pop(k, None)  # as fastprofile 0.2.0 pickled it
    got = pickle.loads(pickle.dumps(v))
    test_eq((got.squares, got.callback_squares), ({}, {}))
    assert math.isnan(got.spread('train', 'Uneven'))

def test_costs_of_0_1_0_load():
    "The 0.1.0 fixture's saved callback costs load, without spreads"
    d = json.loads((Path(__file__).parent/'fixtures'/'v0_1_0'/'profile.json').read_text())['facts']['callback_costs']
    c = CallbackCostsProbe.from_json(d)
    test_eq((c.batches['train'], c.squares), (2, {}))
    assert math.isnan(c.spread('train', 'Recorder', 'after_batch')) and c.lines()

def test_a_lead_the_batches_disagree_on_is_no_lead():
    "The median share and its spread leave a stray batch out; a layer leads only if it takes more time than the next in more than two thirds of the batches"
    from fastprofile.probes.layers import LayerTimes, LayerTime
    tie = LayerTimes('Net', batches=3, samples=48, layers={
        'a': LayerTime('a', 'Linear 64→64', .06, .06, 3, batch_times=[.05, .03, .04]), 'b': LayerTime('b', 'Linear 64→64', .06, .06, 3, batch_times=[.04, .05, .03])})
    assert tie.share('a') - tie.spread('a') > tie.share('b') + tie.spread('b')  # apart by the spread alone
    assert tie.leaders() == [] and tie.lines()[-1].startswith('  No single layer dominates')
    agree = LayerTimes('Net', batches=3, samples=48, layers={
        'a': LayerTime('a', 'Linear 64→64', .06, .06, 3, batch_times=[.05, .06, .04]), 'b': LayerTime('b', 'Linear 64→64', .06, .06, 3, batch_times=[.04, .05, .03])})
    assert [l.name for l in agree.leaders(1)] == ['a']
