"The breakdown belongs to its learner: two at once in two threads, pickling and export, and nothing left behind on any exit"
import pickle, threading, time
import pytest, torch
import fastai.data.load, fastai.torch_core
from fastai.basics import *
from fastai.callback.all import *
from fastai.callback.core import _events
from fastai.test_utils import synth_learner, synth_dbunch, RegModel
from fastprofile.learner import *
from fastprofile.probes.breakdown import BreakdownProbe, Breakdown
from fastprofile.data.pipeline import TimedPipeline, _SWITCHED

class SlowCopy(torch.Tensor):
    "A tensor whose copy to a device sleeps `copy_s` seconds first"
    copy_s = .01
    def to(self, *args, **kwargs):
        time.sleep(self.copy_s)
        return super().to(*args, **kwargs).as_subclass(torch.Tensor)

class Items(torch.utils.data.Dataset):
    "`n` regression items; the `boom_at`-th item loaded raises `exc`; `new_empty` so that `learn.export()` works"
    def __init__(self, n, boom_at=None, exc=RuntimeError): self.x,self.boom_at,self.exc,self.loads = torch.randn(n, 1),boom_at,exc,0
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        self.loads += 1
        if self.loads == self.boom_at: raise self.exc('boom in the loader')
        return self.x[i], 2*self.x[i] + 3
    def new_empty(self): return Items(0)

class Slow(Transform):
    order = 10
    def encodes(self, x:Tensor): time.sleep(.002); return x

def _slow_copy_batch(b):
    xb,yb = fa_collate(b)
    return xb.as_subclass(SlowCopy), yb

def make_learner(n=8, bs=4, slow_copy=False, boom_at=None, exc=RuntimeError, tfm=None, cbs=None, path=None, num_workers=0):
    "A learner whose loaders copy to the CPU (a device, so the copy is timed); `slow_copy`: each copy takes 10 ms"
    kw = dict(create_batch=_slow_copy_batch) if slow_copy else {}
    kw['num_workers'] = num_workers
    tfms = [Slow()] + ([tfm] if tfm is not None else [])
    dls = DataLoaders(TfmdDL(Items(n*bs, boom_at, exc), bs=bs, shuffle=True, after_batch=tfms, **kw),
                      TfmdDL(Items(2*bs), bs=bs, after_batch=[Slow()], **kw), device='cpu')
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), cbs=cbs, path=path or '.')
    learn.remove_cb(ProgressCallback)
    return learn

def _switched(learn): return [{k:dl.__dict__.get(k) for k in _SWITCHED} for dl in learn.dls.loaders]

def assert_nothing_left(learn, switched0):
    "No breakdown on the learner, no timed wrapper on a callback or metric, the loaders and fastai's `to_device` as they were"
    assert not any(isinstance(cb, BreakdownProbe) for cb in learn.cbs)
    assert not [(type(cb).__name__, e) for cb in learn.cbs for e in _events if e in cb.__dict__]
    assert not any('accumulate' in m.__dict__ for m in learn.metrics)
    now = _switched(learn)
    assert all(a[k] is b[k] for a,b in zip(now, switched0) for k in _SWITCHED), (now, switched0)
    assert not any(isinstance(dl.after_batch, TimedPipeline) for dl in learn.dls.loaders)
    assert fastai.data.load.to_device is fastai.torch_core.to_device

# ---- two learners, two threads ----
def test_two_learners_in_two_threads_get_their_own_copy_timings():
    "Each breakdown times its own loader's copy: A copies in 10 ms, B in microseconds, both fits running at once"
    barrier = threading.Barrier(2)
    class Together(Callback):
        "Both fits have started (their breakdowns are on) before either draws a batch"
        def before_train(self): barrier.wait(timeout=60)
    a,b = make_learner(n=10, slow_copy=True, cbs=Together()),make_learner(n=10, cbs=Together())
    errors = []
    def run(learn):
        try:
            with learn.no_logging(): learn.profile(breakdown=True, show_report=False, logger_callback=None).fit(1)
        except BaseException as e: errors.append(e); barrier.abort()
    ts = [threading.Thread(target=run, args=(l,)) for l in (a,b)]
    for t in ts: t.start()
    for t in ts: t.join(120)
    assert not errors, errors
    for learn,slow in ((a,True),(b,False)):
        bd = learn.simple_profile_breakdown
        copy = bd.draw['train']['copy']
        assert copy.n == bd.batches['train'] == 10  # every copy of its own loader, none of the other's
        assert bd.draw['valid']['copy'].n == bd.batches['valid'] == 2
        if slow: assert copy.mean >= SlowCopy.copy_s, bd.draw_parts()
        else: assert copy.mean < SlowCopy.copy_s/2, bd.draw_parts()
        assert bd.draw['train']['Slow'].n == 10

def test_breakdown_takes_nothing_module_wide_while_on():
    "During a breakdown fit fastai's `to_device` is fastai's, and the loader is switched only while it draws"
    seen = []
    class Look(Callback):
        order = 1  # before the breakdown (999) at `before_batch`
        def before_batch(self): seen.append((fastai.data.load.to_device is fastai.torch_core.to_device,
                                             isinstance(self.dl.after_batch, TimedPipeline), self.dl.device))
    learn = make_learner(n=4, cbs=Look())
    learn.profile(breakdown=True, show_report=False, logger_callback=None)
    with learn.no_logging(): learn.fit(1)
    assert seen == [(True, False, torch.device('cpu'))]*6
    assert learn.simple_profile_breakdown.draw['train']['copy'].n == 4

# ---- pickling, export ----
def test_export_after_a_breakdown_and_the_breakdown_pickles(tmp_path):
    learn = make_learner(n=4, path=tmp_path)
    with learn.no_logging(): learn.profile(breakdown=True, show_report=False, logger_callback=None).fit(1)
    bd = learn.simple_profile_breakdown
    assert isinstance(bd, Breakdown) and bd.batches['train'] == 4
    back = pickle.loads(pickle.dumps(bd))
    assert back.draw_parts('train') == bd.draw_parts('train') and back.batches == bd.batches
    assert back.callback_costs().equals(bd.callback_costs())
    learn.export('cloud.pkl')                            # fastai's default: cloudpickle
    learn.export('plain.pkl', pickle_module=pickle)      # the standard pickle too (the lambda it used to hold did not)
    for f in ('cloud.pkl','plain.pkl'):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            back = load_learner(tmp_path/f)
        assert back.simple_profile_breakdown.draw_parts('train') == bd.draw_parts('train')

def test_a_hand_added_breakdown_pickles_after_fit():
    bd = BreakdownProbe()
    learn = make_learner(n=3, cbs=bd)
    with learn.no_logging(): learn.fit(1)
    back = pickle.loads(pickle.dumps(bd))
    assert back.result.batches['train'] == 3

# ---- nothing left behind, however the fit ends ----
class Boom(Callback):
    "Raise `exc` after the prediction of training batch 2"
    def __init__(self, exc): self.exc = exc
    def after_pred(self):
        if self.training and self.iter == 2: raise self.exc('boom')

class BoomTfm(Transform):
    "A batch transform that raises on its third call"
    order = 20
    def __init__(self, exc): super().__init__(); self.exc,self.n = exc,0
    def encodes(self, x:Tensor):
        self.n += 1
        if self.n == 3: raise self.exc('boom')
        return x

@pytest.mark.parametrize('exc', [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize('where', ['callback', 'transform', 'loader'])
def test_nothing_left_after_an_exception(where, exc):
    "In a callback (stand-ins off), in a transform (the stand-in running), in the loader (the stand-in on, never run)"
    kw = dict(callback=dict(cbs=Boom(exc)), transform=dict(tfm=BoomTfm(exc)), loader=dict(boom_at=3, exc=exc))[where]
    learn = make_learner(n=6, bs=1, **kw)
    switched0 = _switched(learn)
    learn.profile(breakdown=True, show_report=False, logger_callback=None)
    with pytest.raises(exc, match='boom'), learn.no_logging(): learn.fit(1)
    assert 'Partial profile' in learn.simple_profile_report.plain()
    assert_nothing_left(learn, switched0)
    if where == 'callback': learn.remove_cb(Boom)
    if where == 'transform': learn.dls.train.after_batch.fs = learn.dls.train.after_batch.fs.filter(lambda f: not isinstance(f, BoomTfm))
    if where == 'loader': learn.dls.train.dataset.boom_at = None
    with learn.no_logging(): learn.fit(1)  # a plain fit afterwards: untimed, unchanged

# ---- training is unchanged ----
class Jitter(Transform):
    "Random noise on training batches only, like an augmentation (it needs the split that `TfmdDL.before_iter` sets)"
    split_idx,order = 0,5
    def encodes(self, x:Tensor): return x + .1*torch.randn_like(x)

@pytest.mark.parametrize('num_workers', [0, 2])
def test_same_training_with_a_breakdown(num_workers):
    "Same seed, same losses, with or without the breakdown; loader workers too; a train-only transform still runs"
    def run(bd):
        set_seed(11, reproducible=True)
        learn = make_learner(n=6, tfm=Jitter(), num_workers=num_workers)
        learn.dls.train.dataset.split_idx,learn.dls.valid.dataset.split_idx = 0,1  # as fastai's `Datasets` subsets
        if bd: learn.profile(breakdown=True, show_report=False, logger_callback=None)
        with learn.no_logging(): learn.fit(2, 1e-2)
        if bd: assert set(learn.simple_profile_breakdown.draw_parts('train')) == {'wait','copy','Slow','Jitter'}
        return [float(v) for v in learn.recorder.losses], [list(map(float, v)) for v in learn.recorder.values]
    assert run(True) == run(False)

# ---- ported from the old test_diagnosis ----
def test_breakdown_leftovers_after_interrupt_are_inert():
    "A hand-added breakdown interrupted (no `after_fit`), then removed: its left-over wrappers time nothing and change nothing"
    class Stop(Callback):
        def after_pred(self):
            if self.training and self.iter == 2: raise KeyboardInterrupt
    bd = BreakdownProbe()
    learn = synth_learner(n_trn=6, n_val=2, cbs=[Stop(), bd])
    with pytest.raises(KeyboardInterrupt): learn.fit(1)
    learn.remove_cbs([Stop, bd])
    n = bd.result.batches['train']
    learn.fit(1)                       # untimed: the left-over wrappers pass straight through
    assert bd.result.batches['train'] == n

def test_breakdown_survives_nested_validate():
    "A callback that calls learn.validate() mid-fit does not end the breakdown of the outer fit"
    class Val(Callback):
        order = 70
        def before_fit(self): self.done = getattr(self, 'done', False)
        def after_epoch(self):
            if self.epoch == 0 and not self.done:  # validate() fires after_epoch too: once only
                self.done = True
                self.learn.validate()
    learn = synth_learner(n_trn=5, n_val=2, cbs=Val())
    learn.profile(breakdown=True, show_report=False, logger_callback=None)
    learn.fit(3)
    assert learn.simple_profile_breakdown.batches['train'] == 3*5

def test_breakdown_survives_validate_inside_a_batch():
    "A `validate()` inside a training batch is not part of the fit's numbers: the train draws after it still split"
    class ValInBatch(Callback):
        def after_batch(self):
            if self.training and self.iter == 1: self.learn.validate()
    learn = synth_learner(n_trn=5, n_val=2, cbs=ValInBatch())
    learn.dls.device = torch.device('cpu')
    switched0 = _switched(learn)
    learn.profile(breakdown=True, show_report=False, logger_callback=None)
    learn.fit(2)
    bd = learn.simple_profile_breakdown
    # every draw of the fit split, the train loader's after the inner validation included; the inner validation is not
    # part of the fit's numbers (the session pauses its probes), as in the report's table
    assert dict(bd.batches) == {'train': 2*5, 'valid': 2*2}
    assert all(bd.draw[p]['copy'].n == bd.batches[p] for p in ('train','valid')), (dict(bd.batches), bd.draw_parts())
    assert_nothing_left(learn, switched0)

def test_breakdown_times_gpu_loaders_with_a_synchronizing_clock():
    "A loader on a CUDA device gets its draw timed after a synchronize (its GPU work in full); a CPU one does not"
    bd = BreakdownProbe()
    learn = make_learner(cbs=bd)
    bd.active,learn.dl = True,learn.dls.train
    tp, = bd._pipelines()
    assert isinstance(tp, TimedPipeline) and tp.clock is time.perf_counter and tp.device == torch.device('cpu')
    learn.dls.train.device = torch.device('cuda')        # set only: nothing runs on it
    tp, = bd._pipelines()
    assert getattr(tp.clock, '__wrapped__', None) is time.perf_counter and tp.device == torch.device('cuda')
    bd.active = False

def test_no_draw_split_under_prefetch():
    "With `CudaPrefetchCallback` the batch is copied and transformed where it is staged: the loader is left alone, the draw is all wait"
    from fastprofile.data.prefetch import CudaPrefetchCallback, LoggingOps
    seen = []
    class Look(Callback):
        order = 1
        def before_batch(self): seen.append(isinstance(self.dl.dl.after_batch, TimedPipeline) or self.dl.device is None)
    learn = make_learner(n=4, cbs=[CudaPrefetchCallback(ops=LoggingOps()), Look()])
    switched0 = _switched(learn)
    learn.profile(breakdown=True, show_report=False, logger_callback=None)
    with learn.no_logging(): learn.fit(1)
    assert learn.cuda_prefetch.active and not any(seen)
    bd = learn.simple_profile_breakdown
    assert set(bd.draw_parts('train')) == {'wait'} and bd.batches['train'] == 4
    assert_nothing_left(learn, switched0)
