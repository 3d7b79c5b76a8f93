"""A record's attributes are all made in `__init__` (the ring, at its first use) and each is either kept by `state()`
or declared `TRANSIENT`. What `state()` keeps is pinned here (`WALL_STATE`, `MERGED_STATE`), not read from the class,
whose `STATE_KEYS` is derived from `__init__`: a new attribute is then kept unless declared transient, and fails here
until it is added to one list or the other. Every value `state()` keeps is plain data (numbers, strings, arrays,
statistics, dataclasses of those): JSON-dumpable once converted, never a clock or another live object. For every
record class: the wall one, the CUDA-events one (events stood in), and the merged one of a DDP gather."""
import dataclasses, json, pickle, math
from collections import deque
import numpy as np
from fastprofile.engine.record import ProfileRecord, RecordAt, TRANSITIONS, Slot, Row
from fastprofile.engine.stats import StreamingStats
from fastprofile.engine.plain import stats_state
from fastprofile.engine.gpu_timing import GpuProfileRecord
from fastprofile.analysis.distributed import MergedRecord, RankProfile, merge_records
from fastprofile.testing import FakeClock, FakeStream, FakeEvent, drive_record, drive_gpu_batches

# What `state()` keeps: a change here is a change of what `learn.export()`, the DDP gather and saved states hold
WALL_STATE = {'keep_batches','warmup','fold_every','stats','samples','tokens','n_batches','epochs','stages','gpu_stats','gpu_ring',
              'n_apart','phase','stage','epoch','fit_start','stage_start','epoch_start','phase_start','_epoch_totals','_phase_batches',
              '_phase_span','_stage_phases','_stage_epochs','_stage_train_batches','closed','_overhead','last_seen','telemetry',
              'ring','timing','gpu_every'}
MERGED_STATE = WALL_STATE | {'ranks','stragglers','missing_ranks','missing_why','world','gather_seconds'}

def _unknown(rec) -> set:
    "The attributes of `rec` that are neither state nor declared transient"
    return set(vars(rec)) - {*type(rec).STATE_KEYS, *type(rec).TRANSIENT}

def plain(v, where='state'):
    "`v` as JSON values; a TypeError naming where it holds something that is not plain data (a function, a clock, a live object)"
    if v is None or isinstance(v, (bool, int, float, str)): return v
    if isinstance(v, (np.integer, np.floating, np.bool_)): return v.item()
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in 'biuf': raise TypeError(f"{where} is an array of {v.dtype}: not plain data")
        return v.tolist()
    if isinstance(v, StreamingStats): return stats_state(v)
    if isinstance(v, ProfileRecord): return plain(v.state(), f'{where}.state()')  # a rank's record in a merged one
    if isinstance(v, dict): return {str(k) if isinstance(k, tuple) else k: plain(x, f'{where}[{k!r}]') for k,x in v.items()}
    if isinstance(v, (list, tuple, deque)): return [plain(x, f'{where}[{i}]') for i,x in enumerate(v)]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name:plain(getattr(v, f.name), f'{where}.{f.name}') for f in dataclasses.fields(v)}
    raise TypeError(f"{where} holds {type(v).__name__} {v!r}: not plain data")

def assert_plain_state(rec):
    "Every value of `rec.state()` is plain data, and that of the record read back from it (as a pickle reads it) too"
    f,args = rec.__reduce__()
    for st in (rec.state(), f(*args).state()):
        json.dumps({k:plain(v, f'state()[{k!r}]') for k,v in st.items()})

def _wall(lazy=False):
    "A record through two stages, a batch set apart, token counts, an interrupt, every reader"
    clock = FakeClock(); rec = ProfileRecord(clock=clock, fold_every=3, lazy=lazy, keep_batches=8)
    rec.overhead_per_batch = lambda: 1e-5
    drive_record(rec, clock, n_epochs=2, n_train=5, n_valid=2, close=False)
    rec.before_fit(); rec.before_epoch(0); rec.before_phase('train')
    for i in range(4):
        for s in Slot: rec.mark(s); clock.tick(.01)
        if i == 2: rec.set_apart()
        rec.add_tokens(7); rec.end_batch(2)
    rec.mark(Slot.DRAW_START); rec.close(interrupted=True)
    rec.results(); rec.recent(); rec.last(3); rec.phase_marks('train'); rec.nbytes
    return rec

def test_state_and_transient_are_declared_once_and_apart():
    for cls in (ProfileRecord, GpuProfileRecord, MergedRecord):
        assert not set(cls.STATE_KEYS) & set(cls.TRANSIENT), cls
        assert len(set(cls.STATE_KEYS)) == len(cls.STATE_KEYS), cls
    # the state is the pinned list: an attribute added to `__init__` is in neither until it is declared here or `TRANSIENT`
    assert set(ProfileRecord.STATE_KEYS) == set(GpuProfileRecord.STATE_KEYS) == WALL_STATE, set(ProfileRecord.STATE_KEYS) ^ WALL_STATE
    assert set(MergedRecord.STATE_KEYS) == MERGED_STATE, set(MergedRecord.STATE_KEYS) ^ MERGED_STATE
    made = set(vars(ProfileRecord())) | {'ring'}  # `__init__`'s attributes, and the ring (made at its first use)
    want = WALL_STATE - {'timing','gpu_every'} | set(ProfileRecord.TRANSIENT) - {'evs'}  # those two and `evs`: class attributes
    assert made == want, made ^ want

def test_every_attribute_of_a_wall_record_is_state_or_transient():
    for lazy in (False, True):
        rec = _wall(lazy)
        assert not _unknown(rec), _unknown(rec)
        assert set(vars(rec)) == set(vars(ProfileRecord())) | {'ring'}  # nothing made outside `__init__` but the ring
        assert set(rec.state()) == WALL_STATE - {'gpu_every'} and set(vars(rec)) - set(rec.TRANSIENT) <= WALL_STATE  # no events: no sampling
        assert_plain_state(rec)
        back = pickle.loads(pickle.dumps(rec))
        assert not _unknown(back) and back.results().equals(rec.results()) and back.position == RecordAt.CLOSED

def test_every_attribute_of_a_gpu_record_is_state_or_transient():
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=4, warmup=1, every=3, keep_batches=8)
    rec.before_fit(); rec.before_epoch(0); drive_gpu_batches(rec, clock, fs, n=20); rec.close(); rec.recent(); rec.results()
    assert not _unknown(rec), _unknown(rec)
    st = rec.state()
    assert st['timing'] == 'events' and st['gpu_every'] == 3 and st['gpu_ring'] is not None
    assert set(st) == WALL_STATE and set(vars(rec)) - set(rec.TRANSIENT) <= WALL_STATE
    assert_plain_state(rec)
    back = pickle.loads(pickle.dumps(rec))  # a plain `ProfileRecord` with the GPU statistics: the events stay behind
    assert type(back) is ProfileRecord and not _unknown(back) and back.results().equals(rec.results())

def test_every_attribute_of_a_merged_record_is_state_or_transient():
    recs = [_wall(), _wall()]
    m = merge_records([RankProfile(i, r, 0.) for i,r in enumerate(recs)])
    assert not _unknown(m), _unknown(m)
    assert set(m.state()) == MERGED_STATE - {'gpu_every'} and set(vars(m)) - set(m.TRANSIENT) <= MERGED_STATE
    assert_plain_state(m)
    back = pickle.loads(pickle.dumps(m))
    assert type(back) is MergedRecord and not _unknown(back) and back.world == 2

def test_a_state_from_before_the_attributes_moved_into_init_loads():
    "0.1.0 wrote states without the keys `__init__` makes now and `start_stage`/`start_phase` made then: they come from `__init__`"
    rec = _wall()
    st = {k:v for k,v in rec.state().items() if k not in ('_phase_batches','_phase_span','_stage_phases','_stage_epochs',
                                                            '_stage_train_batches','telemetry','gpu_every','n_apart')}
    back = ProfileRecord.from_state(st)
    assert not _unknown(back) and back.results().equals(rec.results()) and back.position == RecordAt.CLOSED

def test_the_ring_is_made_at_first_use_and_then_a_plain_attribute():
    rec = ProfileRecord(keep_batches=10)
    assert 'ring' not in vars(rec)
    r = rec.ring
    assert vars(rec)['ring'] is r and rec.ring is r and r.shape[0] == 10
    rec.ring = np.zeros((3, 3))  # a write is a plain one (the fold grows the ring; a saved profile sets it)
    assert rec.ring.shape == (3, 3)

def test_a_start_out_of_order_names_where_the_record_is():
    rec = ProfileRecord(clock=FakeClock())
    for call,where in ((lambda: rec.before_epoch(0), 'IDLE'), (lambda: rec.before_phase('train'), 'IDLE')):
        try: call()
        except RuntimeError as e: assert f'the record is at {where}' in str(e) and 'allowed at' in str(e), e
        else: raise AssertionError('no error')
    rec.before_fit()
    try: rec.before_phase('valid')
    except RuntimeError as e: assert 'needs an open epoch, but the record is at STAGE (allowed at EPOCH, PHASE' in str(e), e
    else: raise AssertionError('no error')
    rec.before_epoch(0); rec.before_phase('valid'); assert rec.position == RecordAt.PHASE
