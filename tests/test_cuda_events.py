"CUDA events outlive their owners in a spare list: a forked worker's garbage collector never frees one (on CPU, with stand-in events)"
import gc
from functools import partial
import pytest
from fastprofile.engine.cuda_events import SPARE, take_event, give_back
from fastprofile.engine.gpu_timing import EventPool
from fastprofile.probes.layers import LayerTimes


class Ev:
    "A stand-in event: counts how many were made"
    made = 0
    def __init__(self): Ev.made += 1


@pytest.fixture(autouse=True)
def empty_spares():
    SPARE.clear(); Ev.made = 0
    yield
    SPARE.clear()


def test_event_pool_gives_its_events_back_when_collected():
    "A pool dropped in a reference cycle (as a learner holds its record) keeps its events alive; the next pool reuses them"
    pool = EventPool(partial(take_event, 0, make=Ev), rows=2, spare=0)
    mine = {id(e) for r in pool.rows for e in r}
    pool.cycle = pool; del pool
    gc.collect()
    assert {id(e) for e in SPARE[(0, True)]} == mine
    again = EventPool(partial(take_event, 0, make=Ev), rows=2, spare=0)
    assert {id(e) for r in again.rows for e in r} == mine and Ev.made == len(mine)  # nothing new made
    assert not SPARE[(0, True)]


def test_pool_of_stand_in_events_keeps_nothing():
    "A pool not made from the spare list (`spare=None`: stand-ins, tests) gives nothing back"
    pool = EventPool(Ev, rows=2)
    del pool; gc.collect()
    assert SPARE == {}


def test_unread_layer_marks_go_back():
    "A `LayerTimes` whose CUDA marks were never read gives their events back when collected; the CPU marks keep nothing"
    evs = [take_event(3, make=Ev) for _ in range(4)]
    r = LayerTimes(); r._dev = 3
    r._raw = [([(evs[0], None, 0), (evs[1], None, -1)], [], [], [], [], True), ([(evs[2], None, 0), (None, 1., -1), (evs[3], None, -1)], [], [], [], [], True)]
    cpu = LayerTimes(); cpu._raw = [([(1., 2., 0), (3., 4., -1)], [], [], [], [], False)]
    r.cycle = r; del r, cpu
    gc.collect()
    assert {id(e) for e in SPARE[(3, True)]} == {id(e) for e in evs}
    assert list(SPARE) == [(3, True)]


def test_give_back_keeps_kinds_and_devices_apart():
    a,b = take_event(0, make=Ev),take_event(0, timing=False, make=Ev)
    give_back([a], 0); give_back([b], 0, timing=False); give_back([None], 1)
    assert take_event(0, timing=False, make=Ev) is b and take_event(0, make=Ev) is a
    assert take_event(1, make=Ev) is not None and Ev.made == 3
