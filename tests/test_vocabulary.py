"""One vocabulary (issue 45): where a profiler event is a fastai event it carries fastai's name, from fastai's callback to
the session (`Session.before_fit`...), the probes (`Probe.before_fit`...) and the record (`ProfileRecord.before_fit`...);
`FIT_EVENTS` (fastprofile.lifecycle.session) says which fastai events the session hears. A probe written with fastprofile
0.2.0's names (`start`, `stage`, `phase`, `end_phase`, `end_stage`, `end`) still hears its events, with a warning."""
import re, warnings
from pathlib import Path
import pytest
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
from fastprofile.engine.core import PROBES, Probe, Sink
from fastprofile.lifecycle.session import FIT_EVENTS, ProbeCallback, Session

PACKAGE = Path(__file__).parent.parent/'fastprofile'

# The retired vocabulary, as code writes it (definitions, calls, the session's event strings), not as prose mentions it:
# the private helpers `_end_phase`/`_start_phase` and the prefetcher's `stage`/`hand_off` (no probe events) are not it
RETIRED = re.compile('|'.join([
    r'\b(?:fit_starts|fit_ends|phase_starts|phase_ends)\b',  # the session's old handlers
    r'\bhand_(?:fit|phase)_\w+',  # the relay of `ProbeCallback`, `BreakdownProbe`, `EfficiencyProbe`
    r'\b(?:start_stage|end_stage|start_epoch|end_epoch|start_phase|end_phase)\(',  # the record's and `Profile`'s methods
    r"'(?:start_stage|end_stage|start_epoch|end_epoch|start_phase|end_phase)'",  # the record's transitions
    r'def (?:start|stage|phase|end_phase|end_stage|end)\(self, s\b',  # the probe events
    r'\.(?:start|stage|phase|end_phase|end_stage|end)\(s\)',  # ... called on a probe
    r"_tell(?:_back)?(?:\(|, )'(?:start|stage|phase|end_phase|end_stage|end)'",  # ... told by the session (or ended)
    r'\belif event_name\b',  # a chain of event tests where a table belongs
]))

def retired_uses(root=PACKAGE) -> list:
    "Where the package's source still defines or calls a retired name: `path:line: text`"
    out = []
    for p in sorted(root.rglob('*.py')):
        if p.name == '_modidx.py': continue  # nbdev's index of the notebooks' symbols, not code
        for i,l in enumerate(p.read_text(encoding='utf-8').splitlines(), 1):
            if RETIRED.search(l): out.append(f"{p.relative_to(root.parent)}:{i}: {l.strip()}")
    return out

def test_the_package_no_longer_speaks_the_old_vocabulary():
    "No definition or call of a retired event name is left in `fastprofile/**/*.py`"
    got = retired_uses()
    assert len(got) == 0, '\n'.join(got)

def test_the_guard_sees_each_retired_form(tmp_path):
    "The guard's patterns catch each form the old vocabulary took (so a zero above means something)"
    lines = ["        if s is not None: s.fit_starts()", "    def before_fit(self): self.hand_fit_starts()",
             "        rec = s.profile.start_stage(dev)", "        'end_phase':   (I, S, E, E, C),",
             "    def stage(self, s):", "p.end_stage(s)", "            self._tell('start')",
             "            self._ending(self._tell_back, 'end')",
             "        elif event_name == 'before_train': self._pop_to(0)"]
    (tmp_path/'fastprofile').mkdir(); (tmp_path/'fastprofile'/'old.py').write_text('\n'.join(lines))
    assert len(retired_uses(tmp_path/'fastprofile')) == len(lines)
    fine = ["    def _end_phase(self):", "    def stage(self, b, tfm=None):", "    def hand_off(self, b):",
            "    def before_fit(self, s):", "self._tell_back('after_fit')"]
    (tmp_path/'fastprofile'/'old.py').write_text('\n'.join(fine))
    assert retired_uses(tmp_path/'fastprofile') == []

QUIET = dict(show_report=False, logger_callback=None)

def _old_style():
    "A 0.2.0 probe: the old event names, each writing itself down"
    class OldStyle(Probe):
        key = 'old_style'
        def __init__(self): self.log = []
        def start(self, s): self.log.append('start')
        def stage(self, s): self.log.append('stage')
        def phase(self, s): self.log.append(f'phase({s.phase})')
        def end_phase(self, s): self.log.append(f'end_phase({s.phase})')
        def end_stage(self, s): self.log.append('end_stage')
        def end(self, s): self.log.append('end' if s.exc is None else 'end!')
        def measured(self): return len(self.log)
    return OldStyle

def test_a_0_2_0_probe_hears_its_events_in_order_with_a_warning():
    "Its old names are mapped once, at class creation (one DeprecationWarning naming old -> new); in a real profiled call it hears each event in order"
    with pytest.warns(DeprecationWarning) as got:
        OldStyle = _old_style()
    assert len(got) == 1
    msg = str(got[0].message)
    for m in ('start -> before_call', 'stage -> before_fit', 'phase -> before_train and before_validate',
              'end_phase -> after_train and after_validate', 'end_stage -> after_fit', 'end -> after_call'):
        assert m in msg, msg
    p = OldStyle()
    learn = synth_learner(n_trn=4, n_val=2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('error', DeprecationWarning)  # mapped at class creation: nothing more during the call
            with learn.no_bar(): learn.profile(probes=[p], **QUIET).fine_tune(1, 1e-2, freeze_epochs=1)
    finally: PROBES.pop('old_style', None)
    fit = ['stage', 'phase(train)', 'end_phase(train)', 'phase(valid)', 'end_phase(valid)', 'end_stage']
    assert p.log == ['start', *fit, *fit, 'end']  # `fine_tune`: one call, two fits
    assert learn.simple_profile.facts.extra['old_style'] == len(p.log)

def test_the_new_name_wins_and_unrelated_methods_are_left_alone():
    "A class defining both an old and a new name keeps its new one; a `start` that takes no session is no probe event"
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)  # neither class is mapped: no warning
        class Both(Probe):
            def before_call(self, s): return 'new'
            def start(self): return 'unrelated'  # a timer's `start()`, say
        class Sampler(Sink):
            def start(self): return 'thread'
            def end(self, a, b): return 'two args'
    assert Both().before_call(None) == 'new' and Both.after_call is Probe.after_call
    assert Sampler.before_call is Probe.before_call and Sampler.after_call is Probe.after_call

def test_a_subclass_of_a_0_2_0_sink_is_mapped_too():
    "`Sink` and `ProbeCallback` subclasses go through the same mapping"
    with pytest.warns(DeprecationWarning, match='end_stage -> after_fit'):
        class OldSink(Sink):
            def end_stage(self, s): return 'ended'
    assert OldSink().after_fit(None) == 'ended'
    with pytest.warns(DeprecationWarning, match='stage -> before_fit'):
        class OldCallback(ProbeCallback):
            def stage(self, s): return 'staged'
    assert OldCallback().before_fit(None) == 'staged'

class Fits(ProbeCallback):
    "Writes down the probe events it hears, and fastai's `before_epoch` (a plain callback event, from fastai)"
    order = 2000
    def __init__(self): self.__dict__['log'] = []
    def before_fit(self, s): self.log.append(f'before_fit{s.stage}')
    def before_train(self, s): self.log.append('before_train')
    def after_validate(self, s): self.log.append('after_validate')
    def after_fit(self, s): self.log.append(f'after_fit{s.stage}')
    def before_epoch(self): self.log.append('epoch')

def test_a_probe_callback_added_by_hand_hears_each_fit():
    "Added by hand, a `ProbeCallback` with the new names drives its own session: before_fit/after_fit per fit (each fit a call), fastai's other events as any callback's"
    learn = synth_learner(n_trn=4, n_val=2)
    cb = Fits()
    learn.add_cb(cb)
    with learn.no_bar():
        learn.fit(1); learn.fit(2)
        learn.validate()  # not a fit: no probe event
    one = ['before_fit0', 'epoch', 'before_train', 'after_validate']
    # fastai fires `before_epoch` in `validate()` too: a plain callback event reaches the callback as fastai fires it
    assert cb.log == [*one, 'after_fit0', *one, 'epoch', 'before_train', 'after_validate', 'after_fit0', 'epoch']
    assert isinstance(cb._own, Session) and not cb._own.active

def test_a_probe_callback_with_fastai_style_fit_events_does_not_crash():
    "A `ProbeCallback` subclass that writes a fit event as fastai's callbacks do (`def before_fit(self)`): called by the session without `s`, with one DeprecationWarning"
    with pytest.warns(DeprecationWarning, match='before_fit, after_fit with no argument'):
        class Plain(ProbeCallback):
            key = 'plain'
            def __init__(self): self.__dict__['log'] = []
            def before_fit(self): self.log.append('before_fit')
            def after_fit(self): self.log.append('after_fit')
    for by_hand in (True, False):
        learn,cb = synth_learner(n_trn=4, n_val=2),Plain()
        with warnings.catch_warnings():
            warnings.simplefilter('error')  # no probe event fails (a failed one warns)
            with learn.no_bar():
                if by_hand: learn.add_cb(cb); learn.fit(1); learn.fit(1)
                else:
                    try: learn.profile(probes=[cb], **QUIET).fit(1)
                    finally: PROBES.pop('plain', None)
        assert cb.log == ['before_fit', 'after_fit']*(2 if by_hand else 1), (by_hand, cb.log)

def test_one_table_names_what_the_session_hears():
    "`FIT_EVENTS` are fastai events, each the session's method of that name; the probe protocol has the same methods"
    from fastai.callback.core import _events
    assert set(FIT_EVENTS) <= set(_events)
    for e in FIT_EVENTS:
        assert callable(getattr(Session, e)) and callable(getattr(Probe, e))

def test_a_probe_callbacks_fit_events_are_no_callback_cost():
    "The callback costs time fastai's calls to a callback: a `ProbeCallback`'s fit and phase events (the session's calls, `FIT_EVENTS`) are not among them, its other fastai events are"
    from fastai.callback.core import _events
    from fastprofile.probes.callback_costs import event_methods
    learn = synth_learner(n_trn=4, n_val=2)
    cb = Fits(); learn.add_cb(cb)
    got = {e for o,e,n in event_methods(learn, _events) if o is cb}
    assert got == {'before_epoch'}, got
