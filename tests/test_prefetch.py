"Fault-injection and cross-cutting tests for `fastprofile.data.prefetch` (CPU with `LoggingOps`; CUDA where lent)"
import gc, json, math, os, sys, weakref, warnings
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
from fastai.basics import *
from fastai.data.core import TfmdDL
from fastai.test_utils import synth_learner
from fastprofile.data.prefetch import *
import fastprofile.data.prefetch as prefetch_mod
from fastcore.test import test_eq as eq, test_fail as fails
# fastai's star import brings fastcore's `test_*` helpers, which pytest would collect as tests
for _n in [n for n in list(globals()) if n.startswith('test')]: del globals()[_n]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---------------------------------------------------------------- helpers

class RecordingOps(LoggingOps):
    "`LoggingOps` that copies and keeps a weakref to the first tensor of each staged batch"
    def __init__(self, *args, **kwargs):
        super().__init__(*args, copy=True, **kwargs)
        self.refs = []
    def stage(self, b, tfm=None):
        b = super().stage(b, tfm)
        self.refs.append(weakref.ref(next(tensor_leaves(b))))
        return b


class Seen(Callback):
    "Record `(training, iter, xb, yb)` at each `before_batch`, the event log, and optionally cancel"
    order = 60
    def __init__(self, log=None, cancel_batch=False): self.log,self.cancel_batch,self.seen = ifnone(log, []),cancel_batch,[]
    def before_batch(self):
        self.seen.append((self.training, self.iter, self.xb, self.yb))
        self.log.append(('before_batch', self.training, self.iter))
        if self.cancel_batch: raise CancelBatchException()
    def after_batch(self): self.log.append(('after_batch', self.training, self.iter))


class RaiseAt(Callback):
    "Raise `exc` at `after_batch` of batch `i` of the training (or validation) epoch, once"
    order = 60
    def __init__(self, exc, i=1, training=True): self.exc,self.i,self.training_,self.done = exc,i,training,False
    def after_batch(self):
        if self.done or self.training!=self.training_ or self.iter!=self.i: return
        self.done = True
        it = self.learn.cuda_prefetch._stager.it
        self.iters = getattr(it, 'it', it)           # the fastai loader's generator, to check it gets closed
        raise self.exc()


def tensor_data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1*torch.randn(n, 1, generator=g))


def noisy(x):
    "A random GPU-style batch transform (applied to each part of the batch): it consumes the global RNG"
    return x + 0.01*torch.randn_like(x)


def make_learner(prefetch=False, ops=None, num_workers=0, bs=8, n_trn=48, n_val=16, after_batch=noisy, cbs=None, **kw):
    "A seeded learner on a small MLP with dropout and a random `after_batch`"
    set_seed(7)
    dls = DataLoaders(TfmdDL(tensor_data(n_trn, 1), bs=bs, shuffle=True, num_workers=num_workers, after_batch=after_batch),
                      TfmdDL(tensor_data(n_val, 2), bs=bs, num_workers=num_workers, after_batch=after_batch))
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    cbs = L(cbs)
    if prefetch: cbs.append(CudaPrefetchCallback(ops=ifnone(ops, LoggingOps(copy=True)), **kw))
    return Learner(dls, model, loss_func=MSELossFlat(), opt_func=partial(SGD, mom=0.9), lr=0.05, cbs=cbs)


def state(learn): return {k: v.clone() for k,v in learn.model.state_dict().items()}


def assert_same_state(a, b):
    assert a.keys()==b.keys()
    for k in a: assert torch.equal(a[k], b[k]), k


def loader_state(dl):
    "What the prefetcher switches while it draws: the loader's `after_batch`, device and pinning"
    return dl.__dict__.get('after_batch'),dl.device,dl.pin_memory,dl.fake_l.pin_memory


def assert_loader_whole(dl, before):
    "The loader's own `after_batch`, device and pinning are back as they were"
    now = loader_state(dl)
    assert now[0] is before[0] and now[1:]==before[1:], (now, before)


# ---------------------------------------------------------------- the engine

def test_stream_ops_waits_copies_and_keeps_reads_in_order():
    "What the side stream waits for, where the copy and `tfm` run, and what the side stream reads is kept until the hand-off"
    from helpers.fake_cuda import FakeCudaApi
    api = FakeCudaApi()
    ops = CudaStreamOps('meta', api=api)  # the real logic on a stand-in `torch.cuda` ('meta' tensors play the GPU's)
    side,staged,handed = ops.side.name,ops.staged_ev.name,ops.handed_ev.name
    x = TensorBase(torch.arange(6.).reshape(2, 3)); x.foo = 'bar'
    host = lambda: (x, {'y': torch.ones(2)}, 'id')
    double = lambda b: (b[0]*2, *b[1:])
    b = ops.stage(host(), tfm=double)
    # first staging of an epoch: wait for all of the compute stream; copy, transform and mark the end on the side stream
    eq(api.log, [('wait_stream', side, 'main'), ('enter', side), ('record', staged, side), ('exit', side)])
    eq(b[0].device.type, 'meta'); eq(type(b[0]), TensorBase); eq(b[0].foo, 'bar'); eq(b[1]['y'].device.type, 'meta'); eq(b[2], 'id')
    eq(ops.reading, [])                                  # host tensors: nothing of the compute stream's is read
    api.log.clear(); ops.hand_off(b)
    # the compute stream waits for the staging and marks the hand-off; no `record_stream` (it aborts forked workers)
    eq(api.log, [('wait_event', 'main', staged), ('record', handed, 'main')])
    api.log.clear(); ops.stage(host())
    eq(api.log[0], ('wait_event', side, handed))        # later stagings wait only for the hand-off point: no wait for step k
    api.log.clear(); on_dev = torch.zeros(4, device='meta')
    staged_b = ops.stage((on_dev, torch.ones(1)))
    # a batch already on the device was written on the compute stream during the draw: wait for all of it, keep it
    eq(api.log[:2], [('wait_stream', side, 'main'), ('enter', side)])
    assert len(ops.reading) == 1 and ops.reading[0] is on_dev
    api.log.clear(); ops.hand_off(staged_b)
    eq(ops.reading, [])                                  # the compute stream now waits for the side stream's reads
    ops.stage((on_dev, torch.ones(1))); api.log.clear()
    ops.reset()                                          # staged, never handed off: the compute stream waits for the reads
    eq(api.log, [('wait_stream', 'main', side)]); eq(ops.reading, [])
    api.log.clear(); ops.stage(host())
    eq(api.log[0], ('wait_stream', side, 'main'))       # after `reset` (a new epoch, a cancel): all of it again
    api.log.clear(); ops.reset()
    eq(api.log, [])                                      # nothing read from the compute stream: nothing to wait for


def test_fake_cuda_checks_signatures():
    "The stand-in refuses calls that the real torch.cuda would refuse, so the test above checks the calls too"
    from helpers.fake_cuda import FakeCudaApi
    api = FakeCudaApi()
    with pytest.raises(TypeError): api.main.wait_event()
    with pytest.raises(TypeError): api.Event(enable_timing=True).record(api.main, 1)
    with pytest.raises(TypeError): api.current_stream('cuda', 0)


def test_stager_one_ahead_and_error_turn():
    log = []
    def src():
        for i in range(2):
            log.append(('next', i)); yield (torch.tensor([i]),)
        log.append(('raise',)); raise RuntimeError('disk gone')
    st = BatchStager(src(), LoggingOps(log))
    eq(st.take()[0], tensor([0]))
    st.stage(); st.stage()
    eq([o for o in log if o[0]=='next'], [('next',0), ('next',1)])
    eq(st.take()[0], tensor([1]))
    st.stage()                                   # batch 2 fails while staging...
    assert ('raise',) in log
    fails(st.take, contains='disk gone')     # ...and surfaces when batch 2 is taken
    fails(st.take, exc=StopIteration)


def test_stager_close_drops_staged_batch_and_closes_iterator():
    closed = []
    def src():
        try:
            for i in range(5): yield (torch.full((1000,), float(i)),)
        finally: closed.append(True)
    ops = RecordingOps()
    st = BatchStager(src(), ops)
    st.take(); st.stage()
    ref = ops.refs[-1]
    assert ref() is not None
    st.close()
    gc.collect()
    assert ref() is None and closed==[True]
    fails(st.take, exc=StopIteration)


def test_stager_types_preserved():
    x = TensorBase(torch.arange(4.)); x.foo = 'bar'
    b = ((x, [torch.ones(2), 'name', 3]), {'y': TensorCategory(tensor([1, 0])), 'meta': None})
    st = BatchStager(iter([b]), LoggingOps(copy=True), tfm=lambda b: b)
    s = st.take()
    eq(type(s), tuple); eq(type(s[0]), tuple); eq(type(s[0][1]), list); eq(type(s[1]), dict)
    eq(type(s[0][0]), TensorBase); eq(s[0][0].foo, 'bar'); eq(s[0][0], x)
    assert s[0][0] is not x                      # a staged copy, not the host tensor
    eq(type(s[1]['y']), TensorCategory)
    eq(s[0][1][1:], ['name', 3]); assert s[1]['meta'] is None


def test_unpinned_warns_once():
    class PinOps(LoggingOps): pins = True       # on CPU nothing is pinned, so this must warn
    learn = make_learner(True, ops=PinOps())
    before = loader_state(learn.dls.train)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.fit(1); learn.fit(1)
    eq(len([w for w in ws if 'not in pinned memory' in str(w.message)]), 1)
    assert_loader_whole(learn.dls.train, before)


@pytest.mark.parametrize('pins,pin,expect', [(True, True, True), (True, False, False), (False, True, False)])
def test_pin_turns_on_loader_pinning_while_iterating(pins, pin, expect):
    "Pinning is turned on while drawing only for ops that want pinned batches, and only with `pin=True`"
    class PinOps(LoggingOps): pass
    PinOps.pins = pins
    pins = []
    learn = make_learner(True, ops=PinOps(), pin=pin)
    dl = learn.dls.train
    learn.dls.n_inp                              # fastai's `_one_pass`, outside any draw, done now
    def create_batch(b):                         # runs inside the draw
        pins.append((dl.pin_memory, dl.fake_l.pin_memory))
        return fa_collate(b)
    dl.create_batch = create_batch
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn.fit(1)
    eq(set(pins), {(expect, expect)})
    eq((learn.dls.train.pin_memory, learn.dls.train.fake_l.pin_memory), (False, False))


def test_ops_created_once_per_device(monkeypatch):
    made = []
    class FakeCudaOps(LoggingOps):
        def __init__(self, device): super().__init__(); made.append(device)
    monkeypatch.setattr(prefetch_mod, 'CudaStreamOps', FakeCudaOps)
    cb = CudaPrefetchCallback()
    ops = [cb._ops_for(torch.device('cuda', 0)) for _ in range(3)]
    assert ops[0] is ops[1] is ops[2]
    cb._ops_for(torch.device('cuda', 1))
    eq(made, [torch.device('cuda', 0), torch.device('cuda', 1)])


# ---------------------------------------------------------------- in fastai's loop

def test_callback_name_order_and_shortcut():
    learn = synth_learner().prefetch(ops=LoggingOps())
    assert isinstance(learn.cuda_prefetch, CudaPrefetchCallback)
    assert 11 < CudaPrefetchCallback.order < Recorder.order   # after DistributedTrainer, before Recorder's sync


def test_bit_identical_and_deterministic():
    a = make_learner(False); a.fit(2)
    b = make_learner(True);  b.fit(2)
    c = make_learner(True);  c.fit(2)
    assert b.cuda_prefetch.active
    assert_same_state(state(a), state(b))
    assert_same_state(state(b), state(c))
    eq(a.recorder.values, b.recorder.values)
    eq(a.recorder.losses, b.recorder.losses)


def test_order_and_content():
    a = make_learner(False, cbs=Seen()); a.fit(1)
    b = make_learner(True, cbs=Seen());  b.fit(1)
    sa,sb = a.seen.seen,b.seen.seen
    eq([o[:2] for o in sb], [o[:2] for o in sa])
    eq(len(sb), len(a.dls.train)+len(a.dls.valid))
    for x,y in zip(sa, sb):
        eq(x[2], y[2]); eq(x[3], y[3])


class _SplitData(TensorDataset):
    "A `TensorDataset` that says which split it is, as fastai's `Datasets` subsets do"
    def __init__(self, split_idx, *tensors): super().__init__(*tensors); self.split_idx = split_idx

class _TrainOnly(Transform):
    split_idx,order = 0,1
    def encodes(self, x:Tensor): return x + 1000 if x.shape[-1] == 4 else x

class _ValidOnly(Transform):
    split_idx,order = 1,2
    def encodes(self, x:Tensor): return x - 1000 if x.shape[-1] == 4 else x

def test_split_only_batch_transforms_keep_running():
    "Train-only (`split_idx=0`, e.g. augmentation) and valid-only batch transforms run as they do without prefetch"
    def learner(prefetch):
        set_seed(7)
        mk = lambda split, n: TfmdDL(_SplitData(split, *tensor_data(n, split+1).tensors), bs=8, shuffle=split==0,
                                     after_batch=[_TrainOnly(), _ValidOnly()])
        cbs = [Seen()] + ([CudaPrefetchCallback(ops=LoggingOps(copy=True))] if prefetch else [])
        return Learner(DataLoaders(mk(0, 32), mk(1, 16)), nn.Linear(4, 1), loss_func=MSELossFlat(), lr=1e-3, cbs=cbs)
    a,b = learner(False),learner(True)
    a.fit(1); b.fit(1)
    assert b.cuda_prefetch.active
    train,valid = [x for t,_,x,_ in a.seen.seen if t],[x for t,_,x,_ in a.seen.seen if not t]
    assert all(x[0].min() > 900 for x in train) and all(x[0].max() < -900 for x in valid)  # each ran in its split
    eq(len(b.seen.seen), len(a.seen.seen))
    for (t1,i1,x1,y1),(t2,i2,x2,y2) in zip(a.seen.seen, b.seen.seen): eq((t1,i1), (t2,i2)); eq(x1, x2); eq(y1, y2)


def test_distributed_dl_counts_samples_at_hand_off():
    "fastai's `DistributedDL` counts samples in its `after_batch` (it trims padding by that count when gathering):"
    "with prefetch the count still moves when the batch is handed over, not one batch early when it is staged"
    from fastai.distributed import DistributedDL
    class Wrap(Callback):   # what fastai's DistributedTrainer (order 11) does, on one process: no process group needed
        order = 11
        def before_train(self): self.learn.dl = DistributedDL(self.dl, rank=0, world_size=1)
        def before_validate(self): self.learn.dl = DistributedDL(self.dl, rank=0, world_size=1)
        def after_batch(self): self.seen.append(self.learn.dl.i)
        def before_fit(self): self.seen = []
    def counts(prefetch):
        learn = make_learner(prefetch, n_trn=18, n_val=9, cbs=Wrap())
        orig = DistributedDL._broadcast
        DistributedDL._broadcast = lambda self, t, rank: list(t)   # fastai's calls `.cuda()`
        try: learn.fit(1)
        finally: DistributedDL._broadcast = orig
        return learn.wrap.seen
    plain = counts(False)
    eq(plain, [8, 16, 18, 8, 9])
    eq(counts(True), plain)


def test_validate_mid_epoch_keeps_staging():
    "A `validate()` called mid-epoch by a callback: the training loop's staging goes on after it"
    class MidVal(Callback):
        order = 70
        def after_batch(self):
            if self.training and self.iter == 2: self.learn.validate()
    learn = make_learner(True, cbs=MidVal())
    learn.fit(1)
    # every loop stages its batches after the first inside the one before, then finds the loader's end:
    # 6 training batches, 2 + 2 validation batches (mid-epoch and at the epoch's end)
    eq(sum(n for _,n in learn.cuda_prefetch.staging.values()), 6 + 2 + 2)
    assert learn.cuda_prefetch._stager is None and not isinstance(learn.dl, StagedLoader)


def test_staged_right_after_step_or_loss():
    "Batch k+1 is staged once step k's work is enqueued: `after_step` in training, `after_loss` in validation"
    class Events(Callback):
        order = 11                               # just before the prefetcher
        def __init__(self, log): self.log = log
        def after_step(self): self.log.append(('after_step',))
        def after_loss(self): self.log.append(('after_loss', self.training))
        def after_batch(self): self.log.append(('after_batch',))
    log = []
    learn = make_learner(True, ops=LoggingOps(log), cbs=Events(log))
    learn.fit(1)
    n_trn,n_val = len(learn.dls.train),len(learn.dls.valid)
    nxt = [log[i+1] for i,o in enumerate(log[:-1]) if o==('stage',)]
    eq(nxt.count(('hand_off',)), 2)              # only each epoch's first batch is staged at draw time
    staged_after = [log[i-1] for i,o in enumerate(log) if o==('stage',) and i and log[i-1]!=('reset',)]
    eq(staged_after.count(('after_step',)), n_trn-1)
    eq(staged_after.count(('after_loss', False)), n_val-1)


def test_cancelled_train_epoch_shows_the_loader_at_after_train():
    "A `CancelTrainException` before any draw still leaves callbacks the user's loader at `after_train`"
    class Cancel(Callback):
        order = 61  # after ProgressCallback (60): fastai's own progress bar crashes if before_train is cancelled before it
        def before_train(self): raise CancelTrainException()
        def after_train(self): self.dl_type = type(self.dl)
    learn = make_learner(True, cbs=Cancel())
    learn.fit(1)
    assert learn.cancel.dl_type is TfmdDL


def test_exactly_one_batch_ahead():
    log = []
    def create_batch(b):
        log.append(('next',))
        return fa_collate(b)
    learn = make_learner(True, cbs=Seen(log))
    learn.dls.n_inp                              # fastai's one-item `_one_pass` now, so it is not counted below
    learn.dls.train.create_batch = create_batch
    learn.fit(1)
    n = len(learn.dls.train)
    drawn = 0
    for o in log:
        if o==('next',): drawn += 1
        elif o[0]=='before_batch' and o[1]: eq(drawn, o[2]+1)           # batch k and nothing more
        elif o[0]=='after_batch' and o[1]:  eq(drawn, min(o[2]+2, n))   # k+1 staged, not k+2
    eq(drawn, n)


def test_no_frame_holds_the_host_batch_while_the_transforms_run():
    "While `after_batch` runs on a staged batch, no frame on the stack holds the host batch it was copied from"
    # fastai's type dispatch keeps the exceptions it catches in cycles with the stack's frames; on Python 3.12 those frames
    # are linked up to the staging code, so a pinned host batch held there outlives the step and, freed later by a forked
    # worker's garbage collector, aborted that worker on an H200. Checked on the stack itself, on any Python.
    host,held = [],[]
    def create_batch(items):
        b = fa_collate(items)
        host.extend(tensor_leaves(b))               # kept alive, so no id is reused by a copy
        return b
    def check(x):                                   # runs on each part of the staged (copied) batch
        ids = {id(t) for t in host}
        if id(x) in ids: return x                   # not a staged copy (fastai's own one-batch pass at `n_inp`)
        f = sys._getframe(1)
        while f is not None:
            for k,v in ({} if f.f_code.co_filename == __file__ else f.f_locals).items():
                if isinstance(v, (Tensor, tuple, list)) and any(id(t) in ids for t in tensor_leaves(v)):
                    held.append(f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}): {k}")
            f = f.f_back
        return x
    learn = make_learner(True, after_batch=check)
    learn.dls.train.create_batch = create_batch
    learn.fit(1)
    assert host and learn.cuda_prefetch.active
    assert not held, f"frames holding a host batch while its copy was transformed: {sorted(set(held))}"


def test_loader_error_raised_when_its_batch_is_drawn():
    log, count = [], [0]
    def create_batch(b):
        count[0] += 1
        if count[0]==3: log.append(('raise',)); raise ValueError('broken batch')
        return fa_collate(b)
    learn = make_learner(True, cbs=Seen(log))
    learn.dls.n_inp                              # fastai's one-item `_one_pass` now, so it is not counted below
    learn.dls.train.create_batch = create_batch
    before = loader_state(learn.dls.train)
    with pytest.raises(ValueError, match='broken batch'): learn.fit(1)
    # the error happened while batch 1 computed, but batch 1 finished and batch 2 never started
    eq(log, [('before_batch',True,0), ('after_batch',True,0), ('before_batch',True,1), ('raise',),
                  ('after_batch',True,1)])
    assert not isinstance(learn.dl, StagedLoader)
    assert_loader_whole(learn.dls.train, before)


def test_generic_loader_error_and_close():
    "A loader that is not a fastai `DataLoader` is staged too; its iterator is closed"
    class BadDL:
        def __init__(self, dl): self.dl,self.closed = dl,False
        def __len__(self): return len(self.dl)
        def __iter__(self):
            try:
                for i,b in enumerate(self.dl):
                    if i==2: raise ValueError('broken batch')
                    yield b
            finally: self.closed = True
    learn = make_learner(True, cbs=Seen())
    bad = learn.dls.train = BadDL(learn.dls.train)
    with pytest.raises(ValueError, match='broken batch'): learn.fit(1)
    assert bad.closed
    eq([o[1] for o in learn.seen.seen], [0, 1])


def test_cancel_batch_keeps_staged_batch():
    class CancelPred(Callback):
        order = 60
        def after_pred(self):
            if self.training and self.iter in (0, 3): raise CancelBatchException()
    a = make_learner(False, cbs=[Seen(), CancelPred()]); a.fit(1)
    b = make_learner(True,  cbs=[Seen(), CancelPred()]); b.fit(1)
    eq([o[:2] for o in b.seen.seen], [o[:2] for o in a.seen.seen])
    for x,y in zip(a.seen.seen, b.seen.seen): eq(x[2], y[2])
    assert_same_state(state(a), state(b))


@pytest.mark.parametrize('exc,training', [(CancelTrainException, True), (CancelValidException, False),
                                          (CancelEpochException, True), (CancelFitException, True)])
def test_cancel_drops_staged_batch_and_closes_iterator(exc, training):
    ops = RecordingOps()
    learn = make_learner(True, ops=ops, cbs=RaiseAt(exc, 1, training))
    before = loader_state(learn.dls.train),loader_state(learn.dls.valid)
    learn.fit(1)
    it = learn.raise_at.iters
    assert it.gi_frame is None                   # the loader's iterator was closed
    gc.collect()
    assert all(r() is None for r in ops.refs)    # nothing staged is kept alive
    assert learn.cuda_prefetch._stager is None
    assert not isinstance(learn.dl, StagedLoader)
    assert_loader_whole(learn.dls.train, before[0]); assert_loader_whole(learn.dls.valid, before[1])
    learn.fit(1)                                 # and the learner trains again
    eq(len(learn.recorder.values), 1)


def test_keyboard_interrupt_mid_epoch():
    ops = RecordingOps()
    learn = make_learner(True, ops=ops, cbs=RaiseAt(KeyboardInterrupt, 1))
    before = loader_state(learn.dls.train)
    with pytest.raises(KeyboardInterrupt): learn.fit(1)
    assert learn.raise_at.iters.gi_frame is None
    gc.collect()
    eq(len(ops.refs), 3)                         # batches 0 and 1 ran (the traceback keeps 1), 2 was staged
    assert ops.refs[-1]() is None
    assert not isinstance(learn.dl, StagedLoader)
    assert_loader_whole(learn.dls.train, before)


def test_empty_loaders():
    learn = make_learner(True, cbs=Seen())
    learn.dls.valid = learn.dls.valid.new(TensorDataset(*[t[:0] for t in learn.dls.valid_ds.tensors]))
    learn.fit(1)
    eq(len(learn.dls.valid), 0)
    eq(len([o for o in learn.seen.seen if not o[0]]), 0)
    learn.dls.train = learn.dls.valid
    learn.fit(1)
    eq(len(learn.seen.seen), len(make_learner().dls.train))


def test_get_preds_and_validate_identical():
    def run(prefetch):
        learn = make_learner(prefetch)      # seeds: each run starts from the same RNG state
        return learn.get_preds(with_input=True),learn.validate()
    (pa,va),(pb,vb) = run(False),run(True)
    for x,y in zip(pa, pb): eq(x, y)
    eq(va, vb)


def test_num_workers():
    a = make_learner(False, num_workers=2, after_batch=None); a.fit(1)
    b = make_learner(True,  num_workers=2, after_batch=None); b.fit(1)
    assert_same_state(state(a), state(b))
    c = make_learner(True, num_workers=2, after_batch=None, cbs=RaiseAt(CancelTrainException, 1)); c.fit(1)
    assert c.raise_at.iters.gi_frame is None
    assert not isinstance(c.dl, StagedLoader)


def test_cpu_pass_through():
    class Check(Callback):
        def before_fit(self): self.types = set()
        def before_batch(self): self.types.add(type(self.dl))
    a = make_learner(False); a.fit(1)
    learn = make_learner(cbs=Check())
    learn.add_cb(CudaPrefetchCallback())
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn.fit(1)
        learn.fit(0)
    assert not learn.cuda_prefetch.active
    eq(len([w for w in ws if 'pass through' in str(w.message)]), 1)
    assert StagedLoader not in learn.check.types
    make_learner(False)   # same seed for the comparison below
    b = make_learner(cbs=CudaPrefetchCallback())
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        b.fit(1)
    assert_same_state(state(a), state(b))


# ---------------------------------------------------------------- with the profiler

def _staged(learn): return {p:(s, n) for p,(s, n) in learn.cuda_prefetch.staging.items()}

def test_staging_is_cumulative():
    "`staging` counts from the callback's creation: fits, `validate()` and `get_preds()` add to it, nothing resets it"
    learn = make_learner(True)
    n_trn,n_val = len(learn.dls.train),len(learn.dls.valid)
    learn.fit(1)
    eq({p:n for p,(_,n) in _staged(learn).items()}, {'train': n_trn, 'valid': n_val})  # n stagings per loop of n batches
    s1 = _staged(learn)
    learn.validate(); learn.get_preds()
    learn.fit(1)
    s2 = _staged(learn)
    eq({p:n for p,(_,n) in s2.items()}, {'train': 2*n_trn, 'valid': 4*n_val})
    assert all(s2[p][0] > s1[p][0] for p in s1)


def test_profiled_fine_tune_counts_the_calls_staging_only():
    "A profiled `fine_tune` (two fits, one call): the facts hold both fits' staging, not what was staged before or after"
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    from fastai.callback.schedule import fine_tune  # noqa: F401 (Learner.fine_tune)
    learn = make_learner(True)
    n_trn,n_val = len(learn.dls.train),len(learn.dls.valid)
    learn.fit(1); learn.validate()                         # staged before the call
    before = _staged(learn)
    learn.profile(show_report=False, logger_callback=None).fine_tune(1, freeze_epochs=1)
    after = _staged(learn)
    f = learn.simple_profile.facts
    assert f.prefetch
    eq({p:s.batches for p,s in f.staging.items()}, {'train': 2*n_trn, 'valid': 2*n_val})
    for p,s in f.staging.items(): assert math.isclose(s.seconds, after[p][0] - before[p][0], rel_tol=1e-12), p
    note = next(n for n in learn.simple_profile_report.notes if n.startswith('CudaPrefetchCallback was active'))
    assert 'per train batch' in note and 'per valid batch' in note
    learn.validate()                                       # after the call: the call's facts do not move
    eq({p:s.batches for p,s in learn.simple_profile.facts.staging.items()}, {'train': 2*n_trn, 'valid': 2*n_val})
    # the next profiled call starts from where this one ended
    learn.profile(show_report=False, logger_callback=None).fit(1)
    eq({p:s.batches for p,s in learn.simple_profile.facts.staging.items()}, {'train': n_trn, 'valid': n_val})


def test_interrupted_profiled_call_keeps_its_staging():
    "A profiled call cut short by a `KeyboardInterrupt`: its partial profile has the staging done until then, and the loader is whole"
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    learn = make_learner(True, cbs=RaiseAt(KeyboardInterrupt, 1))
    before = loader_state(learn.dls.train)
    learn.profile(show_report=False, logger_callback=None)
    with pytest.raises(KeyboardInterrupt): learn.fit(1)
    res = learn.simple_profile
    assert res.interrupted == 'KeyboardInterrupt'
    eq(res.facts.staging['train'].batches, 2)             # batches 1 and 2, staged inside batches 0 and 1
    assert not isinstance(learn.dl, StagedLoader)
    assert_loader_whole(learn.dls.train, before)


# ---------------------------------------------------------------- on a GPU

def gpu_learner(prefetch, n_trn=40, bs=256, width=2048, depth=4, cbs=None, spin_ms=0.):
    "A pinned uint8 'image' loader with a GPU `after_batch` and an MLP (plus `spin_ms` of GPU work in forward and backward)"
    spin = []
    if spin_ms:
        from bench.gpu_timing import cycles_for, SpinLayer
        c = cycles_for(dict(f=spin_ms))['f']
        spin = [SpinLayer(c, c)]
    set_seed(3)
    def ds(n):
        g = torch.Generator().manual_seed(n)
        return TensorDataset(torch.randint(0, 255, (n, 3, 32, 32), dtype=torch.uint8, generator=g),
                             torch.randint(0, 10, (n,), generator=g))
    tfm = lambda x: (x.float()/255 - 0.5).flatten(1) if x.dtype==torch.uint8 else x   # on each part of the batch
    dls = DataLoaders(TfmdDL(ds(n_trn*bs), bs=bs, shuffle=True, num_workers=2, pin_memory=True, after_batch=tfm),
                      TfmdDL(ds(4*bs), bs=bs, num_workers=2, pin_memory=True, after_batch=tfm), device='cuda')
    layers = [nn.Linear(3*32*32, width), nn.ReLU(), *spin]
    for _ in range(depth): layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    cbs = L(cbs) + ([CudaPrefetchCallback()] if prefetch else [])
    return Learner(dls, model, loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=1e-3, cbs=cbs)


@pytest.mark.cuda
@cuda
def test_cuda_results_equal_plain_loop(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', False)
    a = gpu_learner(False, n_trn=8); a.fit(2)
    b = gpu_learner(True, n_trn=8);  b.fit(2)
    assert b.cuda_prefetch.active
    for (k,x),(_,y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=k)


def _intervals(events, pred):
    return sorted((e['ts'], e['ts']+e['dur'], e.get('args', {}).get('stream')) for e in events if pred(e))


@pytest.mark.cuda
@cuda
def test_cuda_workers_fork_after_a_prefetching_learner_is_dropped():
    "Learners that prefetched and were profiled, dropped in reference cycles, are freed by a forked worker's garbage collector: no abort"
    import fastprofile.learner  # noqa: F401 (Learner.profile)
    gc.collect()
    a = gpu_learner(True, n_trn=4); a.fit(1)            # its last batch (staged on the side stream) stays on `a.xb`
    assert a.cuda_prefetch.active
    p = gpu_learner(True, n_trn=6)                      # a profile: the event pool, the layer timer's marks (never read)
    p.profile(show_report=False, logger_callback=None).fit(1)
    assert p.simple_profile_record.timing == 'events' and p.simple_profile.facts.layers._raw
    del a, p                                            # a Learner is a reference cycle: garbage, not freed yet
    b = gpu_learner(False, n_trn=4)
    b.dls.train.wif = gc.collect                         # each worker frees the parent's garbage at once (fastai calls `wif` there)
    b.fit(1)                                            # with `record_stream` the workers aborted (CUDA initialization error)
    assert len(b.recorder.losses) == 4


@pytest.mark.cuda
@cuda
def test_cuda_workers_fork_after_pinned_batches_went_through_fastai_transforms():
    "Pinned batches from workers, staged through fastai's `IntToFloatTensor` and `Normalize`; then a fit whose workers free the parent's garbage: no abort"
    from fastai.data.transforms import IntToFloatTensor, Normalize
    # the transforms' type dispatch keeps an exception in a cycle with the stack's frames at each batch (for the labels,
    # which they do not encode); on Python 3.12 the frames reach the staging code: a pinned batch held there was freed by
    # a forked worker's garbage collector, and the worker aborted (CUDA initialization error; the prefetch benchmark, H200)
    g = torch.Generator().manual_seed(0)
    items = [(TensorImage(torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8, generator=g)), TensorCategory(i % 10)) for i in range(4*64)]
    tfms = [IntToFloatTensor(), Normalize.from_stats([0.5]*3, [0.25]*3, cuda=False)]
    dls = DataLoaders(TfmdDL(items, bs=64, num_workers=2, pin_memory=True, after_batch=tfms),
                      TfmdDL(items[:64], bs=64, num_workers=0, pin_memory=True, after_batch=tfms), device='cuda')
    gc.collect()
    gc.disable()                                        # the garbage must reach the fork (not freed here by chance)
    try:
        a = Learner(dls, nn.Sequential(nn.Flatten(), nn.Linear(3*32*32, 10)), loss_func=CrossEntropyLossFlat(), cbs=CudaPrefetchCallback())
        a.fit(1)
        assert a.cuda_prefetch.active
        del a                                           # with its batches' frames, garbage now
        b = gpu_learner(False, n_trn=4)
        b.dls.train.wif = gc.collect                     # each worker frees the parent's garbage at once
        b.fit(1)
    finally: gc.enable()
    assert len(b.recorder.losses) == 4


@pytest.mark.cuda
@cuda
def test_cuda_copy_overlaps_compute(tmp_path):
    from torch.profiler import profile, ProfilerActivity
    # GPU-bound by construction (6 ms of GPU work in forward and in backward): fastai's per-batch host work (~1-2 ms, more
    # under torch's profiler) must not drain the compute stream before the next batch is staged, or there is nothing to
    # overlap with. With 2 ms the H200 saw 55% and 77% in full runs of the CUDA tests (80% or more run alone, 3 of 3)
    learn = gpu_learner(True, n_trn=24, spin_ms=6.)
    learn.fit(1)                                        # warm-up: workers, cuBLAS, the allocator
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        learn.fit(1)
    p = tmp_path/'trace.json'
    prof.export_chrome_trace(str(p))
    evs = [e for e in json.loads(p.read_text())['traceEvents'] if e.get('ph')=='X' and 'dur' in e]
    copies = _intervals(evs, lambda e: e.get('name','').startswith('Memcpy HtoD (Pinned -> Device)'))
    kernels = _intervals(evs, lambda e: e.get('cat')=='kernel')
    assert copies and kernels
    tot = ovl = 0.
    for s,e,stream in copies:
        tot += e-s
        busy = sorted((max(s,ks),min(e,ke)) for ks,ke,kst in kernels if kst!=stream and ks<e and ke>s)
        cur = s                                         # union of the overlapping kernel intervals
        for a,b in busy:
            if b>cur: ovl += b-max(a,cur); cur = b
    assert ovl/tot >= 0.8, f"only {ovl/tot:.0%} of the copy time overlapped compute"


@pytest.mark.cuda
@cuda
def test_cuda_peak_memory_at_most_one_staged_batch():
    def peak(prefetch):
        gc.collect(); torch.cuda.empty_cache()          # a Learner is a reference cycle: free the previous one's weights now
        learn = gpu_learner(prefetch, n_trn=8)
        learn.fit(1)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()            # weights, gradients, optimizer state
        learn.fit(1)
        torch.cuda.synchronize()
        p = torch.cuda.max_memory_allocated() - base
        del learn
        return p
    base,staged = peak(False),peak(True)
    bs = 256
    batch = bs*3*32*32*(1+4) + bs*8*2               # the raw uint8 copy, its float transform, the targets
    assert staged <= base + batch + 2**20, (base, staged, batch)


@pytest.mark.cuda
@cuda
def test_cuda_reserved_memory_flat():
    class Reserved(Callback):
        def before_fit(self): self.res = []
        def after_epoch(self): torch.cuda.synchronize(); self.res.append(torch.cuda.memory_reserved())
    learn = gpu_learner(True, n_trn=8, cbs=Reserved())
    learn.fit(4)
    r = learn.reserved.res
    assert max(r[1:]) <= r[1], r                    # no growth after the first epoch
    eq(len(learn.cuda_prefetch._ops_by_device), 1)


def test_staging_device_is_where_fastai_runs_batch_transforms():
    "fastai loaders: their own `device` (None: batches stay on the CPU, so no prefetch); other loaders: the model's"
    import torch.utils.data as tud
    from fastai.test_utils import synth_learner
    learn = synth_learner(n_trn=2, n_val=1, cbs=CudaPrefetchCallback())
    cb = learn.cuda_prefetch
    learn.dl = learn.dls.train
    learn.dls.train.device = None
    assert cb._staging_device() is None
    learn.dls.train.device = torch.device('cpu')
    assert cb._staging_device() == torch.device('cpu')
    learn.dl = tud.DataLoader(tud.TensorDataset(torch.zeros(4, 1), torch.zeros(4, 1)), batch_size=2)
    assert cb._staging_device() == next(learn.model.parameters()).device
