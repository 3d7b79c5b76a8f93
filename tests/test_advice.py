"`check_advice` leaves the learner exactly as it was: training after it is training without it, on every exit path"
import random, time, warnings
import numpy as np, pytest, torch
import fastai.data.load, fastai.torch_core
from fastai.basics import *
from fastai.callback.all import *
from fastai.callback.core import _events
from fastai.test_utils import RegModel
from fastprofile.learner import *
from fastprofile.data.pipeline import TimedPipeline, _SWITCHED
from fastprofile.fixes.advice import check_advice, preserved
from fastprofile.engine.record import Row
from fastprofile.lifecycle.session import Session

class Items(torch.utils.data.Dataset):
    "Regression items with a little noise drawn when each is loaded (in a worker with `num_workers>0`)"
    def __init__(self, n): self.x = torch.randn(n, 1)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return self.x[i] + .01*torch.randn(1), 2*self.x[i] + 3

class Jitter(Transform):
    "Noise on training batches (the global torch RNG, in the main process)"
    split_idx = 0
    def encodes(self, x:Tensor): return x + .05*torch.randn_like(x)

def slow_metric(inp, targ): time.sleep(.01); return (inp-targ).abs().mean()

class TwoGroups(Module):
    "`RegModel` with its two parameters in two layer groups, so that `fine_tune` freezes one"
    def __init__(self): self.a,self.b = nn.Linear(1, 1),nn.Linear(1, 1)
    def forward(self, x): return self.b(self.a(x))

def make_learner(num_workers=0, n=12, bs=4, seed=3, metrics=slow_metric, cbs=None, path=None):
    "The same learner for the same seed: shuffled loaders with random items and batch transforms, a slow metric"
    set_seed(seed, reproducible=True)
    dls = DataLoaders(TfmdDL(Items(n*bs), bs=bs, shuffle=True, num_workers=num_workers, after_batch=[Jitter()]),
                      TfmdDL(Items(4*bs), bs=bs, num_workers=num_workers), device='cpu')
    dls.train.dataset.split_idx,dls.valid.dataset.split_idx = 0,1
    learn = Learner(dls, TwoGroups(), loss_func=MSELossFlat(), metrics=metrics, cbs=cbs, lr=1e-2,
                    splitter=lambda m: [list(m.a.parameters()), list(m.b.parameters())], path=path or '.')
    learn.remove_cb(ProgressCallback)
    return learn

def rng_state(): return random.getstate(), np.random.get_state(), torch.get_rng_state()
def set_rng_state(s): random.setstate(s[0]); np.random.set_state(s[1]); torch.set_rng_state(s[2])

def twin_runs(learn, twin, before, between, after):
    "Train `learn` (`before`, `between`, `after`) and `twin` (`before`, `after`) from the same global RNG state; their histories"
    s = rng_state()
    before(learn); between(learn); after(learn)
    h = history(learn)
    set_rng_state(s)
    before(twin); after(twin)
    return h, history(twin)

def history(learn):
    "Everything the learner's training leaves to compare: Recorder history, weights, optimizer state"
    r = learn.recorder
    plain = lambda d: {k:(v.tolist() if isinstance(v, Tensor) else v) for k,v in d.items()}
    sd = None if learn.opt is None else learn.opt.state_dict()
    opt = None if sd is None else ([plain(st) for st in sd['state']], [plain(h) for h in sd['hypers']])
    return dict(losses=[float(v) for v in r.losses], values=[list(map(float, v)) for v in r.values],
                lrs=list(map(float, r.lrs)), weights={k:v.tolist() for k,v in learn.model.state_dict().items()}, opt=opt,
                frozen=getattr(learn.opt, 'frozen_idx', None), grads=[p.requires_grad for p in learn.model.parameters()],
                modes=[m.training for m in learn.model.modules()])

def snapshot(learn):
    "What `preserved` promises to put back, by identity where it can"
    return dict(d=dict(learn.__dict__), cbs=list(learn.cbs), cb_keys=[set(cb.__dict__) for cb in learn.cbs],
                hist=history(learn), rng=[dl.rng.getstate() for dl in learn.dls.loaders], rngs=[id(dl.rng) for dl in learn.dls.loaders],
                loaders=[{k:dl.__dict__.get(k) for k in _SWITCHED} for dl in learn.dls.loaders],
                workers=[dl.fake_l.num_workers for dl in learn.dls.loaders], metrics=list(learn.metrics),
                glob=(random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()))

def assert_as_before(learn, s):
    d = learn.__dict__
    assert set(d) == set(s['d']), set(d) ^ set(s['d'])
    assert all(d[k] is v for k,v in s['d'].items() if k != 'cbs'), [k for k,v in s['d'].items() if d[k] is not v]
    assert list(learn.cbs) == s['cbs'] and all(a is b for a,b in zip(learn.cbs, s['cbs']))
    assert [set(cb.__dict__) for cb in learn.cbs] == s['cb_keys']  # no timed wrapper left on a callback
    assert all(cb.learn is learn for cb in learn.cbs)
    assert history(learn) == s['hist']
    assert [dl.rng.getstate() for dl in learn.dls.loaders] == s['rng'] and [id(dl.rng) for dl in learn.dls.loaders] == s['rngs']
    assert [{k:dl.__dict__.get(k) for k in _SWITCHED} for dl in learn.dls.loaders] == s['loaders']
    assert [dl.fake_l.num_workers for dl in learn.dls.loaders] == s['workers']
    assert list(learn.metrics) == s['metrics'] and not any('accumulate' in m.__dict__ for m in learn.metrics)
    assert (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()) == s['glob']
    assert fastai.data.load.to_device is fastai.torch_core.to_device
    assert Session.of(learn) is None or any(type(cb).__name__ == 'SimpleProfilerCallback' for cb in s['cbs'])

# ---- after a profiled fit ----
def test_check_advice_after_a_profiled_fit():
    "The user's profile, Recorder history (48 losses, not 6) and everything else are as they were"
    learn = make_learner(n=24)
    learn.profile(show_report=False, logger_callback=None).fit(2)
    res,s = learn.simple_profile,snapshot(learn)
    assert len(s['hist']['losses']) == 48
    chk = check_advice(learn, n_batches=4, resource='callbacks')
    assert chk.change == dict(kind='remove_metric', name='slow_metric'), chk
    assert learn.simple_profile is res and learn.simple_profile_results is res.results
    assert_as_before(learn, s)

# ---- an interrupt inside ----
class InterruptSecondWindow(Callback):
    "Raise `KeyboardInterrupt` in the second fit it sees (the window after the change)"
    def __init__(self): self.fits = 0
    def before_fit(self): self.fits += 1
    def after_pred(self):
        if self.fits == 2 and self.training and self.iter == 1: raise KeyboardInterrupt

def slower_metric(inp, targ): time.sleep(.1); return (inp-targ).abs().mean()

def test_an_interrupt_inside_propagates_and_leaves_everything_restored():
    """The interrupt comes in the second window, which runs only if the first window's diagnosis offers to remove the metric:
    a metric of 100 ms a validation batch, over 10x the rest of a batch (~2 ms; ~10 ms on a loaded machine), makes that certain"""
    def interrupted(learn):
        cb = InterruptSecondWindow()
        learn.add_cb(cb)
        s = snapshot(learn)
        with pytest.raises(KeyboardInterrupt): check_advice(learn, n_batches=3, resource='callbacks')
        assert cb.fits == 0  # its own state came back too
        assert_as_before(learn, s)
        learn.remove_cb(cb)
    mk = lambda: make_learner(metrics=slower_metric)
    a,b = twin_runs(mk(), mk(), lambda l: l.fit(1), interrupted, lambda l: l.fit(2))
    assert a == b

@pytest.mark.parametrize('exc', [RuntimeError, KeyboardInterrupt])
def test_preserved_restores_on_any_exception(exc):
    "A block that trains, adds and removes callbacks, changes the loaders and reseeds, then raises: all undone"
    def block(learn):
        s = snapshot(learn)
        with pytest.raises(exc):
            with preserved(learn):
                learn.remove_cb(Recorder); learn.add_cb(Callback()); learn.metrics = []; learn.freeze()
                learn.dls.train.fake_l.num_workers = 2; learn.dls.train.rng.random(); torch.manual_seed(99)
                learn.profile(breakdown=True, show_report=False, logger_callback=None)
                learn.fit(1, 1e-1)
                raise exc('inside')
        assert_as_before(learn, s)
    a,b = twin_runs(make_learner(), make_learner(), lambda l: l.fit(1), block, lambda l: l.fit(2))
    assert a == b

# ---- training after it is training without it ----
@pytest.mark.parametrize('num_workers', [0, 2])
def test_training_after_check_advice_is_training_without(num_workers):
    "Bit-identical losses, weights and optimizer state on two learners of the same seed, one checked in between"
    def checked(learn):
        chk = check_advice(learn, n_batches=3, resource='callbacks')
        assert chk.change is not None and not math.isnan(chk.measured)  # both windows ran
    a,b = twin_runs(make_learner(num_workers), make_learner(num_workers), lambda l: l.fit(1), checked, lambda l: l.fit(2))
    assert a == b

def test_training_after_check_advice_is_training_without_after_fine_tune():
    "`fine_tune` (frozen, then unfrozen; the optimizer's state of both) before and after"
    def checked(learn):
        s = snapshot(learn)
        check_advice(learn, n_batches=3, resource='callbacks')
        assert_as_before(learn, s)
    tune = lambda l: l.fine_tune(1, freeze_epochs=1)
    a,b = twin_runs(make_learner(), make_learner(), tune, checked, tune)
    assert a == b

def test_check_advice_leaves_dl_rng_as_it_was():
    "The shuffle RNG of each loader: the same object in the same state"
    learn = make_learner()
    rngs = [(dl.rng, dl.rng.getstate()) for dl in learn.dls.loaders]
    check_advice(learn, n_batches=3, resource='callbacks')
    assert all(dl.rng is r and dl.rng.getstate() == st for dl,(r,st) in zip(learn.dls.loaders, rngs))

def test_the_users_armed_profile_still_profiles_the_next_fit():
    learn = make_learner()
    learn.profile(show_report=False, logger_callback=None)
    session = Session.of(learn)
    check_advice(learn, n_batches=3, resource='callbacks')
    assert Session.of(learn) is session
    with pytest.raises(NoProfileError): learn.simple_profile  # the windows' profiles are gone
    learn.fit(1)
    rec = learn.simple_profile_record
    assert len(rec.stages) == 1 and rec.stats[Row('train','batch')].n == 12 - 1  # the user's fit, warm-up batch aside
    assert Session.of(learn) is None and not any(type(cb).__name__.startswith('SimpleProfiler') for cb in learn.cbs)

def test_saving_callbacks_sit_the_windows_out(tmp_path):
    "Callbacks (the user's profiler pair included), Recorder history and RNG are restored; saving callbacks sit the windows out"
    from fastai.callback.tracker import SaveModelCallback
    learn = make_learner(path=tmp_path)
    learn.fit(2)
    learn.profile(show_report=False, logger_callback=None)
    learn.add_cb(SaveModelCallback())
    s = snapshot(learn)
    check_advice(learn, n_batches=3, resource='callbacks')
    assert_as_before(learn, s)
    assert not (tmp_path/'models').exists()     # SaveModelCallback did not run in the windows

def test_callbacks_keep_their_objects():
    "A callback's state comes back as the same objects (the user's list, the model's modules), with their contents as they were"
    store = []
    class Collect(Callback):
        def __init__(self, store): self.store = store
        def before_fit(self): self.layer = self.learn.model.a
        def after_batch(self): self.store.append(1)
    cb = Collect(store)
    learn = make_learner(cbs=cb)
    learn.fit(1)
    n = len(store)
    check_advice(learn, n_batches=3, resource='callbacks')
    assert cb.store is store and len(store) == n   # the same list, as it was
    assert cb.layer is learn.model.a               # not a copy of the model's layer
