"""A record's attributes are all made in `__init__` (the ring, at its first use) and each is either kept by `state()`
(`STATE_KEYS`) or declared `TRANSIENT`: a new attribute that is neither fails here. For every record class: the wall
one, the CUDA-events one (events stood in), and the merged one of a DDP gather."""
import pickle, math
import numpy as np
from fastprofile.engine.record import ProfileRecord, RecordAt, TRANSITIONS, Slot, Row
from fastprofile.engine.gpu_timing import GpuProfileRecord
from fastprofile.analysis.distributed import MergedRecord, RankProfile, merge_records
from fastprofile.testing import FakeClock, FakeStream, FakeEvent, drive_record, drive_gpu_batches

def _unknown(rec) -> set:
    "The attributes of `rec` that are neither state nor declared transient"
    return set(vars(rec)) - {*type(rec).STATE_KEYS, *type(rec).TRANSIENT}

def _wall(lazy=False):
    "A record through two stages, a batch set apart, token counts, an interrupt, every reader"
    clock = FakeClock(); rec = ProfileRecord(clock=clock, fold_every=3, lazy=lazy, keep_batches=8)
    rec.overhead_per_batch = lambda: 1e-5
    drive_record(rec, clock, n_epochs=2, n_train=5, n_valid=2, close=False)
    rec.start_stage(); rec.start_epoch(0); rec.start_phase('train')
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
    assert set(vars(ProfileRecord())) | {'ring'} == set(ProfileRecord.STATE_KEYS) - {'timing','gpu_every'} | set(ProfileRecord.TRANSIENT) - {'evs'}

def test_every_attribute_of_a_wall_record_is_state_or_transient():
    for lazy in (False, True):
        rec = _wall(lazy)
        assert not _unknown(rec), _unknown(rec)
        assert set(vars(rec)) == set(vars(ProfileRecord())) | {'ring'}  # nothing made outside `__init__` but the ring
        back = pickle.loads(pickle.dumps(rec))
        assert not _unknown(back) and back.results().equals(rec.results()) and back.position == RecordAt.CLOSED

def test_every_attribute_of_a_gpu_record_is_state_or_transient():
    clock = FakeClock(); fs = FakeStream(clock)
    rec = GpuProfileRecord(make_event=lambda: FakeEvent(fs), clock=clock, pool_batches=4, warmup=1, every=3, keep_batches=8)
    rec.start_stage(); rec.start_epoch(0); drive_gpu_batches(rec, clock, fs, n=20); rec.close(); rec.recent(); rec.results()
    assert not _unknown(rec), _unknown(rec)
    st = rec.state()
    assert st['timing'] == 'events' and st['gpu_every'] == 3 and st['gpu_ring'] is not None
    back = pickle.loads(pickle.dumps(rec))  # a plain `ProfileRecord` with the GPU statistics: the events stay behind
    assert type(back) is ProfileRecord and not _unknown(back) and back.results().equals(rec.results())

def test_every_attribute_of_a_merged_record_is_state_or_transient():
    recs = [_wall(), _wall()]
    m = merge_records([RankProfile(i, r, 0.) for i,r in enumerate(recs)])
    assert not _unknown(m), _unknown(m)
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
    for call,where in ((lambda: rec.start_epoch(0), 'IDLE'), (lambda: rec.start_phase('train'), 'IDLE')):
        try: call()
        except RuntimeError as e: assert f'the record is at {where}' in str(e) and 'allowed at' in str(e), e
        else: raise AssertionError('no error')
    rec.start_stage()
    try: rec.start_phase('valid')
    except RuntimeError as e: assert 'needs an open epoch, but the record is at STAGE (allowed at EPOCH, PHASE' in str(e), e
    else: raise AssertionError('no error')
    rec.start_epoch(0); rec.start_phase('valid'); assert rec.position == RecordAt.PHASE
