"""The lifecycle of a profiled call (issue 21), as a contract: what `learn.profile()` and `with learn.profiling()` profile,
that the result lands on the learner before any output step, and that the learner is exactly as before however the
call ends (`helpers.state`: every attribute of the learner, its callbacks, metrics, loaders, datasets and modules, and
fastai's functions, against the same run without the profiler)"""
import math, threading
from types import SimpleNamespace
import pandas as pd, pytest, torch
from fastai.basics import *
from fastai.callback.all import *
from fastai.metrics import mae
from fastai.test_utils import synth_learner
import fastai.data.load, fastai.torch_core
from fastprofile.all import *
from fastprofile.engine.core import Sink
from fastprofile.engine.record import ProfileRecord
from fastprofile.engine.tables import ProfileReport
import fastprofile.learner as fl
from helpers.state import learner_state, state_diff, twin_diff, outcome, outcome_diff
from test_core import Raiser, EXITS, check_sums

N_TRN,N_VAL,BS = 6,3,16  # batches per epoch (synth_learner's batches hold 16 samples)
QUIET = dict(show_report=False, logger_callback=None)
OPTIONS = {'default':{}, 'breakdown':dict(breakdown=True), 'efficiency':dict(efficiency=True),
           'telemetry':dict(telemetry=True, telemetry_every=.005)}  # telemetry: the sampler thread (CPU readings) on

class Tally(Callback):
    "A user's callback with its own state and an event method set on the instance (as some libraries do)"
    order = 40
    def __init__(self): self.n = 0; self.after_batch = self._count
    def _count(self): self.n += 1

def make(path=None, *cbs):
    "A small learner with a metric and a user's callback"
    return synth_learner(n_trn=N_TRN, n_val=N_VAL, metrics=mae, cbs=[Tally(), *cbs], path=path)

def run(mk, script, arm=None, expect=()):
    "Seed, make a learner, picture it, run `script(learn, arm)` (`arm` None: the unprofiled twin), picture it again"
    set_seed(7, reproducible=True)
    learn = mk()
    before,error = learner_state(learn),None
    try: script(learn, arm)
    except expect as e: error = e
    return SimpleNamespace(learn=learn, before=before, after=learner_state(learn), outcome=outcome(learn), error=error)

def check_as_twin(p, t, same_error=True):
    "The profiled run `p` left the learner exactly as its twin `t` did: nothing left behind, the same training, bit for bit"
    diff = twin_diff(p.before, p.after, t.before, t.after)
    assert not diff, "the profiled call left this behind:\n" + '\n'.join(diff)
    ended,twin_ended = repr(p.error),repr(t.error)
    if same_error: assert ended == twin_ended, f"the profiled run ended by {ended}, its twin by {twin_ended}"
    assert not outcome_diff(p.outcome, t.outcome), outcome_diff(p.outcome, t.outcome)
    assert fastai.data.load.to_device is fastai.torch_core.to_device
    assert not [t for t in threading.enumerate() if t.name == 'fastprofile-telemetry'], "the telemetry sampler's thread is still running"

def result_or_none(learn):
    "The learner's last profile, or None"
    try: return learn.simple_profile
    except ValueError: return None

def counts(learn) -> dict:
    "What a profile counted: stages, epochs, and the draws and batches of each phase"
    rec,r = learn.simple_profile_record,learn.simple_profile_results.set_index(['Phase','Action','Step'])['Number of Calls']
    n = lambda *k: int(r.get(k, 0))
    return dict(stages=len(rec.stages), epochs=len(rec.epochs), epoch_row=n('fit','epoch',''), fit_row=n('fit','fit',''),
                train_draw=n('train','draw',''), train_batch=n('train','batch',''),
                valid_draw=n('valid','draw',''), valid_batch=n('valid','batch',''))

def _rows(learn): return learn.simple_profile_results.set_index(['Phase','Action','Step'])

def arm_profile(opts): return lambda learn: learn.profile(**QUIET, **opts)

# ---- the picture of a learner can fail ----
def _add_hook(learn): learn.model.register_forward_hook(lambda *a: None)
def _global_hook(learn, undo):
    h = torch.nn.modules.module.register_module_forward_hook(lambda *a: None); undo.append(h.remove)

LEFTOVERS = {
    'loader after_batch': (lambda learn, undo: setattr(learn.dls.train, 'after_batch', Pipeline([])), 'dls.train.after_batch'),
    'loader attribute':   (lambda learn, undo: learn.dls.valid.__dict__.__setitem__('create_batches', print), 'dls.valid.create_batches'),
    'learner method':     (lambda learn, undo: learn.__dict__.__setitem__('fit', lambda *a, **k: None), 'learn.fit'),
    'callback kept':      (lambda learn, undo: learn.add_cb(Callback()), 'learn.cbs'),
    'callback attribute': (lambda learn, undo: learn.recorder.__dict__.__setitem__('_profiled', True), 'Recorder._profiled'),
    'callback method':    (lambda learn, undo: learn.tally.__dict__.__setitem__('after_batch', lambda: None), 'Tally.after_batch'),
    'metric accumulate':  (lambda learn, undo: learn.metrics[0].__dict__.__setitem__('accumulate', lambda l: None), 'metrics[0]:AvgMetric.accumulate'),
    'dataset attribute':  (lambda learn, undo: setattr(learn.dls.train.dataset, 'seen', 1), 'dls.train.dataset.seen'),
    'module hook':        (lambda learn, undo: _add_hook(learn), '_forward_hooks'),
    'global module hook': (_global_hook, 'torch global hooks'),
    'fastai function':    (None, 'module fastai.data.load.to_device'),
    'fastai method':      (None, 'class fastai.learner.Recorder.after_batch'),
}

@pytest.mark.parametrize('what', LEFTOVERS)
def test_learner_state_detects_what_is_left_behind(what, monkeypatch):
    "Each kind of leftover, put there by hand after a plain fit, is named by `twin_diff`; two plain twins differ in nothing"
    leave,where = LEFTOVERS[what]
    undo = []
    def fit(learn, leftover):
        learn.fit(1)
        if not leftover: return
        if what == 'fastai function': monkeypatch.setattr(fastai.data.load, 'to_device', lambda b, *a, **k: b)
        elif what == 'fastai method': monkeypatch.setattr(Recorder, 'after_batch', lambda self: None)
        else: leave(learn, undo)
    try:
        t,clean,dirty = run(make, fit),run(make, fit),run(make, fit, arm=True)
    finally:
        for f in undo: f()
    assert not twin_diff(clean.before, clean.after, t.before, t.after)
    diff = twin_diff(dirty.before, dirty.after, t.before, t.after)
    assert diff and any(where in d for d in diff), diff

def test_learner_state_covers_the_learner():
    "The picture has the learner, each callback, the metric, both loaders and their datasets, every module, fastai's functions"
    s = learner_state(make())
    for name in ('learn', 'learn.cbs', 'cbs[0]:TrainEvalCallback', 'metrics[0]:AvgMetric', 'dls.train', 'dls.valid', 'dls.train.dataset',
                 'dls.valid.dataset', 'dls.train.fake_l', 'model', 'module fastai.data.load', 'torch global hooks'):
        assert name in s, name
    assert any(k.startswith('cbs[') and k.endswith(':Tally') for k in s)
    assert 'after_batch' in s[next(k for k in s if k.endswith(':Tally'))]
    assert '_forward_hooks' in s['model']
    learn = make()
    a = learner_state(learn)
    assert state_diff(a, learner_state(learn)) == []  # nothing happened: the same picture
    other = learner_state(make())
    assert state_diff(a, other, ids=False) == [] and state_diff(a, other)  # another learner: the same shape, other objects

# ---- A. the next training call is the profiled call ----
METHODS = {'fit': lambda l: l.fit(2, 1e-2), 'fit_one_cycle': lambda l: l.fit_one_cycle(2, 1e-2), 'fit_flat_cos': lambda l: l.fit_flat_cos(2, 1e-2),
           'fit_sgdr': lambda l: l.fit_sgdr(2, 1), 'fine_tune': lambda l: l.fine_tune(1, 1e-2, freeze_epochs=1)}

@pytest.mark.parametrize('opts', OPTIONS)
@pytest.mark.parametrize('method', METHODS)
def test_each_training_method_is_one_call_and_leaves_the_learner_as_before(method, opts):
    "fit, fit_one_cycle, fit_flat_cos, fit_sgdr, fine_tune: one profiled call, the same training bit for bit, nothing left behind"
    def script(learn, arm):
        if arm: arm(learn)
        METHODS[method](learn)
    t,p = run(make, script),run(make, script, arm_profile(OPTIONS[opts]))
    check_as_twin(p, t)
    c,n_epochs = counts(p.learn),(2 if method == 'fine_tune' else len(t.learn.recorder.values))  # fit_sgdr(2, 1): 3 epochs
    assert c['stages'] == c['fit_row'] == (2 if method == 'fine_tune' else 1)
    assert c['epochs'] == c['epoch_row'] == n_epochs
    assert c['train_draw'] == n_epochs*(N_TRN-1) and c['valid_draw'] == n_epochs*(N_VAL-1)
    check_sums(_rows(p.learn))
    # the next plain call is not profiled
    res = p.learn.simple_profile
    p.learn.fit(1)
    assert p.learn.simple_profile is res

def test_with_learn_keeps_the_learner_armed():
    "`with learn:` (as `tta` runs) is not the profiled call: the fit after it is"
    def script(learn, arm):
        if arm: arm(learn)
        with learn: pass
        learn.fit(1)
    t,p = run(make, script),run(make, script, arm_profile({}))
    check_as_twin(p, t)
    assert counts(p.learn)['stages'] == 1 and counts(p.learn)['train_draw'] == N_TRN-1

# ---- D. validate / get_preds / lr_find before, inside and after the profiled call ----
def op_validate(learn):
    r = learn.validate()
    assert len(r) == 2 and all(math.isfinite(float(v)) for v in r)  # valid loss, mae
    return [float(v) for v in r]

def op_get_preds(learn):
    preds,targs = learn.get_preds()
    assert preds.shape == targs.shape == (N_VAL*BS, 1)
    return preds, targs

def op_lr_find(learn):
    learn.lr_find(start_lr=1e-5, end_lr=1e-1, num_it=6, show_plot=False, suggest_funcs=None)
    lrs = [float(v) for v in learn.recorder.lrs]
    assert len(lrs) == 6 and lrs == sorted(lrs) and lrs[0] < lrs[-1]
    return lrs, [float(v) for v in learn.recorder.losses]

OPS = {'validate':op_validate, 'get_preds':op_get_preds, 'lr_find':op_lr_find}
WHENS = ('before', 'batch', 'epoch', 'after')  # after `profile()` before the fit; at `after_batch` of training batch 2; at `after_epoch`; after the call

class CallOp(Callback):
    "Run `op` once during the first fit: at `after_batch` of training batch 2 of epoch 0 (`at='batch'`) or at `after_epoch` of epoch 0"
    order = 70
    def __init__(self, op, at, outs): self.op,self.at,self.outs,self.done = op,at,outs,False
    def _go(self):
        self.done = True
        self.outs.append(self.op(self.learn))
    def after_batch(self):
        if self.at == 'batch' and not self.done and self.training and self.iter == 2 and self.epoch == 0: self._go()
    def after_epoch(self):
        if self.at == 'epoch' and not self.done and self.epoch == 0: self._go()

FITS = {'fit': lambda l: l.fit(2, 1e-2), 'fine_tune': lambda l: l.fine_tune(1, 1e-2, freeze_epochs=1), 'fit1': lambda l: l.fit(1, 1e-2)}
_BASELINES = {}

def baseline(method, opts) -> dict:
    "The counts of the same profiled fit without any op"
    if (method, opts) not in _BASELINES:
        def script(learn, arm): arm(learn); FITS[method](learn)
        _BASELINES[(method, opts)] = counts(run(lambda: make(None, CallOp(None, None, [])), script, arm_profile(OPTIONS[opts])).learn)
    return _BASELINES[(method, opts)]

# (method, op, when) -> why plain fastai (no profiler) raises there: the twin's error then skips the case. None do with
# fastai 2.8: every op runs at every point, so a twin that raises is an error, not a skip (fastprofile's `all_batches`
# runs the twin's loop too); a listed case that no longer raises fails, so the list cannot outlive its reason
PLAIN_FASTAI_RAISES = {}

def _op_matrix():
    for method in ('fit', 'fine_tune'):
        for opts in OPTIONS:
            for op in OPS:
                for when in WHENS: yield method, opts, op, when

@pytest.mark.parametrize('method,opts,op,when', list(_op_matrix()), ids=['-'.join(x) for x in _op_matrix()])
def test_ops_around_and_inside_the_call(method, opts, op, when, tmp_path):
    "The op works (as in the unprofiled twin, bit for bit), the profile counts what the same fit without the op counts, nothing is left"
    def script(learn, arm):
        if arm: arm(learn)
        if when == 'before': outs.append(OPS[op](learn))
        FITS[method](learn)
        if when == 'after': outs.append(OPS[op](learn))
    outs = []
    mk = lambda: make(tmp_path, CallOp(OPS[op], when, outs))
    t = run(mk, script, expect=Exception)
    why = PLAIN_FASTAI_RAISES.get((method, op, when))
    if why is not None:
        assert t.error is not None, f"{op} at {when} ({method}) is listed as raising in plain fastai ({why}) but ran: take it off PLAIN_FASTAI_RAISES"
        pytest.skip(f"{op} at {when} fails in plain fastai, without fastprofile ({why}): {t.error!r}")
    assert t.error is None, f"{op} at {when} ({method}) raised without the profiler: {t.error!r} (if fastai's own, list it in PLAIN_FASTAI_RAISES with why)"
    twin_outs,outs[:] = list(outs),[]
    p = run(mk, script, arm_profile(OPTIONS[opts]), expect=Exception)
    assert p.error is None, p.error
    assert len(outs) == len(twin_outs) == 1
    for a,b in zip(L(outs[0]), L(twin_outs[0])):  # the op's result, as without the profiler
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)
    check_as_twin(p, t)
    assert counts(p.learn) == baseline(method, opts)
    check_sums(_rows(p.learn))

# ---- B. `with learn.profiling(**opts):` one profiled call around a block ----
def profiling_script(body):
    "A script running `body(learn)` inside `learn.profiling(**arm)` (or, for the twin, without it)"
    def script(learn, arm):
        if arm is None: return body(learn)
        with learn.profiling(**QUIET, **arm) as l:
            assert l is learn  # it yields the learner
            body(learn)
    return script

def test_profiling_two_fits_are_one_call():
    "Two fits in the block: one result with two stages, the same training as without the profiler, nothing left"
    def body(learn): learn.fit(1, 1e-2); learn.fit(1, 1e-2)
    t,p = run(make, profiling_script(body)),run(make, profiling_script(body), arm={})
    check_as_twin(p, t)
    c = counts(p.learn)
    assert c['stages'] == c['fit_row'] == 2 and c['epochs'] == 2 and c['train_draw'] == 2*(N_TRN-1)
    check_sums(_rows(p.learn))

def test_profiling_shows_one_report_at_the_exit(capsys):
    "With `show_report=True`, nothing is shown inside the block; one report at its exit"
    learn = make()
    with learn.profiling(logger_callback=None, plain=True):
        learn.fit(1); learn.fit(1)
        assert 'Simple Profiler Results' not in capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count('Simple Profiler Results') == 1 and '2 fits in this call' in out

def test_profiling_matches_profile():
    "`with learn.profiling(...): learn.fit_one_cycle(2)` has the rows and call counts of `learn.profile(...).fit_one_cycle(2)`"
    set_seed(7, reproducible=True)
    a = make()
    a.profile(**QUIET).fit_one_cycle(2)
    set_seed(7, reproducible=True)
    b = make()
    with b.profiling(**QUIET): b.fit_one_cycle(2)
    cols = ['Phase','Action','Step','Number of Calls']
    pd.testing.assert_frame_equal(a.simple_profile_results[cols].reset_index(drop=True), b.simple_profile_results[cols].reset_index(drop=True))

@pytest.mark.parametrize('opts', OPTIONS)
def test_ops_inside_profiling_are_not_stages(opts, tmp_path):
    "lr_find, validate and get_preds in the block, around one fit: one stage, the fit's counts, nothing left"
    def body(learn):
        op_lr_find(learn); op_validate(learn)
        learn.fit(2, 1e-2)
        op_get_preds(learn); op_validate(learn)
    mk = lambda: make(tmp_path)
    t,p = run(mk, profiling_script(body)),run(mk, profiling_script(body), arm=OPTIONS[opts])
    check_as_twin(p, t)
    want = baseline('fit', opts)
    assert counts(p.learn) == want

BAD = [(dict(warmup=-1), ValueError), (dict(bogus=1), TypeError), (dict(logger_callback='nope'), ValueError),
       (dict(csv_name='x.csv'), ValueError), (dict(efficiency='sometimes'), ValueError), (dict(breakdown='yes'), (ValueError, TypeError)),
       (dict(telemetry='often'), ValueError), *([(dict(memory_snapshot=True), ValueError)] if not torch.cuda.is_available() else [])]  # a CPU learner

@pytest.mark.parametrize('bad,err', BAD, ids=[next(iter(b)) for b,_ in BAD])
def test_profiling_checks_its_options_at_the_call(bad, err):
    "Bad options raise at `learn.profiling(...)`, before any block runs; the learner is as before and not armed"
    def script(learn, arm):
        if arm is not None:
            with pytest.raises(err): learn.profiling(**arm)
            with pytest.raises(err):
                with learn.profiling(**arm): ran.append(True)
        learn.fit(1)
    ran = []
    t,p = run(make, script),run(make, script, arm=bad)
    assert not ran
    check_as_twin(p, t)
    assert result_or_none(p.learn) is None  # the fit after was not profiled

@pytest.mark.parametrize('exc', [RuntimeError, KeyboardInterrupt])
def test_profiling_block_ended_by_an_exception(exc):
    "An exception in the block (here between fits) propagates; the learner is as before; the result so far is on the learner"
    def body(learn):
        learn.fit(1, 1e-2)
        raise exc('raised in the block')
    t,p = run(make, profiling_script(body), expect=exc),run(make, profiling_script(body), arm={}, expect=exc)
    assert isinstance(p.error, exc)
    check_as_twin(p, t)
    c = counts(p.learn)
    assert c['stages'] == 1 and c['train_draw'] == N_TRN-1
    check_sums(_rows(p.learn))
    res = p.learn.simple_profile
    p.learn.fit(1)
    assert p.learn.simple_profile is res  # the block is over: the next fit is not profiled

def test_profiling_without_a_fit_leaves_no_result():
    "A block in which no fit ran leaves no result, and a previous result as it was"
    def body(learn): op_validate(learn); op_get_preds(learn)
    t,p = run(make, profiling_script(body)),run(make, profiling_script(body), arm={})
    check_as_twin(p, t)
    assert result_or_none(p.learn) is None
    learn = make()
    learn.profile(**QUIET).fit(1)
    res = learn.simple_profile
    with learn.profiling(**QUIET): learn.validate()
    assert learn.simple_profile is res
    learn.fit(1)
    assert learn.simple_profile is res

def test_profile_or_profiling_inside_profiling_is_refused():
    "`learn.profile()` or a nested `learn.profiling()` in the block raises ValueError; the block's own profile goes on"
    def script(learn, arm):
        if arm is None: return learn.fit(2, 1e-2)
        with learn.profiling(**QUIET):
            with pytest.raises(ValueError): learn.profile(**QUIET)
            with pytest.raises(ValueError):
                with learn.profiling(**QUIET): pass
            learn.fit(2, 1e-2)
    t,p = run(make, script),run(make, script, arm={})
    check_as_twin(p, t)
    assert counts(p.learn) == baseline('fit', 'default')
    def uncaught(learn): learn.profile(**QUIET)
    p = run(make, profiling_script(uncaught), arm={}, expect=ValueError)
    assert isinstance(p.error, ValueError)
    t = run(make, lambda learn, arm: None)
    check_as_twin(p, t, same_error=False)

CM_EXITS = [(e, x) for e in ('before_fit', 'after_batch', 'after_epoch', 'after_fit') for x in (KeyboardInterrupt, RuntimeError)]

@pytest.mark.parametrize('event,exc', CM_EXITS, ids=[f'{e}-{x.__name__}' for e,x in CM_EXITS])
def test_profiling_block_ended_inside_a_fit(event, exc):
    "An interrupt or an error at a fastai event of a fit in the block: it propagates, the learner is as before, the partial result sums"
    mk = lambda: make(None, Raiser(event, exc))
    def body(learn): learn.fit(2, 1e-2)
    t,p = run(mk, profiling_script(body), expect=exc),run(mk, profiling_script(body), arm={}, expect=exc)
    assert isinstance(p.error, exc) and p.learn.raiser.raised == 1
    check_as_twin(p, t)
    if event != 'before_fit':
        assert p.learn.simple_profile.interrupted.startswith(exc.__name__)
        check_sums(_rows(p.learn))

# ---- C. the result is on the learner before any output step ----
class Checking(Sink):
    "A sink that notes, when it logs, whether the result it gets is already `learn.simple_profile`"
    def __init__(self, learn): self.learn,self.seen = learn,[]
    def log_fit(self, result): self.seen.append(result_or_none(self.learn) is result)

def test_result_is_on_the_learner_when_sinks_log():
    learn = make()
    sink = Checking(learn)
    learn.profile(show_report=False, logger_callback=sink).fit(1)
    assert sink.seen == [True]

def _left_in_cycles(calls) -> list:
    "Objects of fastprofile's own types that `calls()` leaves in reference cycles (freed only by the garbage collector), the collector off meanwhile"
    import gc
    gc.collect()
    gc.disable()
    try:
        calls()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith('fastprofile')})
    finally:
        gc.set_debug(0); gc.garbage.clear(); gc.enable()

@pytest.mark.parametrize('how', ['profile', 'profiling', 'fine_tune'])
def test_a_call_leaves_nothing_for_the_garbage_collector(how):
    "When a call ends its session lets go of its probes (and its profile of it): the call's objects go as soon as the next result replaces its own, none left in cycles for the collector (whose passes a sweep of short fits would pay)"
    learn = make()
    def calls():
        for _ in range(2):  # the second call's result replaces the first's: all of the first call is garbage then
            if how == 'profiling':
                with learn.profiling(**QUIET): learn.fit(1)
            elif how == 'fine_tune': learn.profile(**QUIET).fine_tune(1)
            else: learn.profile(**QUIET).fit(1)
    assert _left_in_cycles(calls) == []
    assert isinstance(learn.simple_profile, ProfileResult) and learn.simple_profile.results is not None
    assert _left_in_cycles(lambda: learn.fit(1)) == []  # and an unprofiled fit afterwards neither

def test_a_probe_hears_only_the_events_it_defines():
    "The session calls a probe only at the events it defines (a method of its class, or one set on the instance), in every fit of the call"
    heard = []
    class Ends(Sink):
        def after_call(self, s): heard.append('after_call')
    class Phases(Sink):
        def before_train(self, s): heard.append(('phase', s.phase))
        before_validate = before_train
    late = Sink()
    late.after_fit = lambda s: heard.append('after_fit')  # set on the instance
    learn = make()
    s = fl.session_for(learn, show_report=False, logger_callback=None)
    sess = fl.Session(learn, s.profile, [*s.probes[:-1], Ends(), Phases(), late, s.probes[-1]], cbs=s.cbs)
    sess.arm(); learn.fit(2)
    assert heard == [('phase','train'), ('phase','valid'), ('phase','train'), ('phase','valid'), 'after_fit', 'after_call']
    assert learn.simple_profile.record.stages[0].epochs == 2

def test_a_sink_reads_the_stats_during_the_call_after_fold():
    "A profile's record folds the ended phases when read: a sink that reads the statistics at a fit's end folds first and sees every batch"
    from fastprofile.engine.record import Row
    seen = []
    class PerFit(Sink):
        def after_fit(self, s):
            r = s.record
            unfolded = r.stats[Row('train','batch')].n + r.stats[Row('train','warmup')].n
            r.fold()
            seen.append((unfolded, r.stats[Row('train','batch')].n + r.stats[Row('train','warmup')].n))
    learn = make()
    n = len(learn.dls.train)
    learn.profile(show_report=False, logger_callback=PerFit()).fit(2)
    assert seen[-1][1] == 2*n and seen[-1][0] < 2*n, seen  # lazy: not folded until asked; complete once folded
    assert learn.simple_profile.record.stats[Row('train','batch')].n + learn.simple_profile.record.stats[Row('train','warmup')].n == 2*n

class Once:
    "Raise KeyboardInterrupt the first time it is called"
    def __init__(self): self.n = 0
    def __call__(self):
        self.n += 1
        if self.n == 1: raise KeyboardInterrupt

STEPS = ('close', 'section', 'csv', 'log', 'show')
CSV_WRITTEN = ('section', 'log', 'show')  # the steps after the CSV is saved (the report's sections are made when it is shown)

@pytest.mark.parametrize('step', STEPS)
def test_interrupt_during_a_fit_end_step(step, tmp_path, monkeypatch, capsys):
    "Ctrl-C while the call ends (closing, a report section, the CSV, a sink, showing): it propagates; the result is kept; nothing is left"
    fire,opts = Once(),dict(QUIET, save_csv=True)
    if step == 'close':
        real = ProfileRecord.close
        def close(self, *a, **k): fire(); return real(self, *a, **k)
        monkeypatch.setattr(ProfileRecord, 'close', close)
    elif step == 'section':
        def interrupting_section(result): fire()
        monkeypatch.setattr(fl, 'SECTIONS', list(fl.SECTIONS) + [interrupting_section])
        opts.update(show_report=True, plain=True)
    elif step == 'csv':
        real = pd.DataFrame.to_csv
        def to_csv(self, path_or_buf=None, *a, **k):
            if fire.n == 0:
                if hasattr(path_or_buf, 'write'): path_or_buf.write('Phase,Action,St')
                else: Path(path_or_buf).write_text('Phase,Action,St')
                fire()
            return real(self, path_or_buf, *a, **k)
        monkeypatch.setattr(pd.DataFrame, 'to_csv', to_csv)
    elif step == 'log':
        class Interrupting(Sink):
            def log_fit(self, result): fire()
        opts['logger_callback'] = Interrupting()
    elif step == 'show':
        monkeypatch.setattr(ProfileReport, 'show', lambda self, *a, **k: fire())
        opts['show_report'] = True
    def script(learn, arm):
        if arm: learn.profile(**arm)
        learn.fit(1, 1e-2)
    mk = lambda: make(tmp_path)
    t = run(mk, script)
    p = run(mk, script, arm=opts, expect=KeyboardInterrupt)
    assert fire.n >= 1 and isinstance(p.error, KeyboardInterrupt)
    check_as_twin(p, t, same_error=False)
    csv = tmp_path/'simple_profile.csv'
    assert [f.name for f in tmp_path.iterdir() if f != csv] == []  # no temporary file is left
    res = result_or_none(p.learn)
    p.learn.fit(1)  # the next plain fit works and is not profiled
    assert result_or_none(p.learn) is res
    assert res is not None, "the call's result is not on the learner"
    check_sums(_rows(p.learn))
    if step != 'close':
        assert counts(p.learn) == baseline('fit1', 'default')  # the complete numbers
        assert counts(p.learn)['train_draw'] == N_TRN-1
    # `output` saves the CSV first, then logs, then shows: an interrupt at a later step finds it written; one while closing
    # (the result kept, the interrupt raised before any output) or while writing it (the temporary file removed) leaves none
    assert csv.exists() == (step in CSV_WRITTEN), (step, csv.exists())
    if step in CSV_WRITTEN:  # complete: the results as the learner has them
        got = pd.read_csv(csv)
        assert list(got.columns) == list(res.results.columns) and len(got) == len(res.results)
        assert list(got['Number of Calls']) == list(res.results['Number of Calls'])

# ---- E. an interrupt or an error at each fastai event, with the options that patch more ----
_TWINS = {}

@pytest.mark.parametrize('opts', ['breakdown', 'efficiency', 'telemetry'])
@pytest.mark.parametrize('event,exc', EXITS, ids=[f'{e}-{x.__name__}' for e,x in EXITS])
def test_every_exit_with_breakdown_and_efficiency(event, exc, opts):
    "KeyboardInterrupt or RuntimeError at each event: it propagates, the learner is as before (and trained as without the profiler), the partial profile sums"
    mk = lambda: make(None, Raiser(event, exc, train=event not in ('before_validate', 'after_validate')))
    def script(learn, arm):
        if arm: arm(learn)
        learn.fit(2, 1e-2)
    key = (event, exc)
    if key not in _TWINS: _TWINS[key] = run(mk, script, expect=exc)
    t,p = _TWINS[key],run(mk, script, arm_profile(OPTIONS[opts]), expect=exc)
    assert isinstance(p.error, exc) and p.learn.raiser.raised == 1
    check_as_twin(p, t)
    if event != 'before_fit':
        assert p.learn.simple_profile.interrupted.startswith(exc.__name__)
        check_sums(_rows(p.learn))
    res = result_or_none(p.learn)
    p.learn.remove_cb(Raiser)
    p.learn.fit(1)
    assert result_or_none(p.learn) is res
