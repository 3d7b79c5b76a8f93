"A profile armed and not run yet (a notebook cell run twice), replaced by `learn.profile()` or `with learn.profiling()`: a warning names the earlier options that will not apply"
import warnings
import pytest
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.engine.core import Probe, PROBES
from fastprofile.lifecycle.session import Session

QUIET = dict(logger_callback=None, show_report=False)

def _warnings(f) -> list:
    "The fastprofile warnings `f()` gives: (message, file it points at)"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always'); f()
    return [(str(m.message), m.filename) for m in w if str(m.message).startswith('fastprofile:')]

@pytest.fixture
def learn(tmp_path):
    l = synth_learner(n_trn=8, n_val=2); l.path = tmp_path
    return l

def test_profile_again_names_the_options_it_drops(learn, tmp_path):
    learn.profile(save_csv=True, breakdown=True, **QUIET)  # armed; no fit ran
    got = _warnings(lambda: learn.profile(**QUIET))
    assert got == [("fastprofile: `learn.profile()` replaces the profile armed earlier on this learner, whose options `save_csv=True`, "
                     "`breakdown=True` will not apply (pass them again to keep them)", __file__)]  # pointing at the line that replaced it
    learn.fit(1)
    assert learn.simple_profile.facts.breakdown is None and not (tmp_path/'simple_profile.csv').exists()  # the replacing one ran

def test_only_what_the_new_profile_drops_is_named(learn):
    learn.profile(save_csv=True, warmup=0, **QUIET)
    got = _warnings(lambda: learn.profile(save_csv=True, warmup=2, plain=True, **QUIET))  # kept, changed, added
    assert len(got) == 1 and "whose options `warmup=0` will not apply" in got[0][0]

def test_the_same_cell_run_again_drops_nothing(learn):
    learn.profile(save_csv=True, breakdown=True, **QUIET)
    assert _warnings(lambda: learn.profile(save_csv=True, breakdown=True, **QUIET)) == []
    _warnings(lambda: learn.profile())  # defaults only...
    assert _warnings(lambda: learn.profile(save_csv=True)) == []  # ...replaced: nothing of the earlier is lost
    learn.fit(1)

def test_a_logger_a_csv_name_and_own_probes_are_named(learn):
    class Counter(Probe):
        key = 'rearm_counter'
    try:
        learn.profile(logger_callback=None, csv_name='runs/a.csv', save_csv=True, probes=[Counter()], show_report=False)
        got = _warnings(lambda: learn.profile(save_csv=True, show_report=False))
        assert len(got) == 1 and got[0][0].endswith("whose options `logger_callback=None`, `csv_name='runs/a.csv'`, `probes=[Counter(...)]` "
                                                    "will not apply (pass them again to keep them)"), got
        learn.fit(1)
    finally: PROBES.pop('rearm_counter', None)

def test_a_profiling_block_replacing_an_armed_profile_warns(learn):
    learn.profile(breakdown=True, **QUIET)
    def block():
        with learn.profiling(**QUIET): learn.fit(1)
    got = _warnings(block)
    assert got == [("fastprofile: `with learn.profiling()` replaces the profile armed earlier on this learner, whose options `breakdown=True` "
                    "will not apply (pass them again to keep them)", __file__)]
    assert learn.simple_profile.facts.breakdown is None and Session.of(learn) is None

def test_lr_find_leaves_it_armed_so_a_new_profile_still_warns(learn):
    learn.profile(breakdown=True, **QUIET)
    learn.lr_find(num_it=3, show_plot=False)  # not a training call: still armed
    assert len(_warnings(lambda: learn.profile(**QUIET))) == 1

def test_no_warning_once_the_earlier_profile_ran(learn):
    learn.profile(breakdown=True, **QUIET).fit(1)  # spent: nothing armed
    assert _warnings(lambda: learn.profile(**QUIET)) == []
    def block():
        with learn.profiling(**QUIET): learn.fit(1)
    assert _warnings(block) == []
