"`MachineProbe` (`facts.machine`) on real learners: processes spinning beside a fit make it a busy machine, named in one line; the verdicts from numbers; its facts read back as measured; where /proc is missing, what was not measured; training unchanged"
import json, math, multiprocessing, re, subprocess, sys, time
from dataclasses import fields
import pytest
import torch
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
import fastprofile.probes.machine as machine
from fastprofile.probes.machine import MachineProbe, MachineLoad, MachineSpan, allowed_cpus, running_children, WAIT_SHARE, OTHER_CPUS
from fastprofile.learner import session_for

def _learner(n_trn=400, **kw):
    "A synthetic regression learner: a few hundred small batches, a fraction of a second on a quiet CPU"
    return synth_learner(n_trn=n_trn, n_val=40, **kw)

def _profile(learn, machine_probe=True, epochs=1) -> MachineLoad|None:
    "Profile `learn.fit(epochs)` quietly (without the machine probe: `machine_probe=False`); its `facts.machine`"
    s = session_for(learn, logger_callback=None, show_report=False)
    assert sum(isinstance(p, MachineProbe) for p in s.probes) == 1  # on by default, once
    if not machine_probe: s.probes = [p for p in s.probes if not isinstance(p, MachineProbe)]
    s.arm(); learn.fit(epochs)
    return learn.simple_profile.facts.extra.get('machine')

def _spin(n:int) -> list:
    "`n` processes that keep a CPU each busy: `python3 -c 'while True: pass'` (stopped by `_stop`, always)"
    return [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(n)]

def _stop(ps):
    for p in ps: p.kill()
    for p in ps: p.wait()

def test_two_spinning_processes_make_a_busy_machine_named_first():
    learn = _learner()
    learn.fit(1)  # warm (imports, first allocations) before the neighbours start
    ps = _spin(max(2, len(allowed_cpus())))  # two on the 2-CPU machine this was written on: enough to fill every CPU this process may use
    try:
        time.sleep(.3)  # the spinners are running
        learn.profile(show_report=False, logger_callback=None).fit(1)
    finally: _stop(ps)
    m = learn.simple_profile.facts.machine
    assert isinstance(m, MachineLoad) and not m.unmeasured, m.unmeasured
    assert m.wait_share('train') >= WAIT_SHARE and m.other_cpus('train') >= OTHER_CPUS, (m.wait_share('train'), m.other_cpus('train'))
    assert m.busy()
    line = m.line()
    assert line.startswith('Busy machine: the main thread waited for a CPU ') and 'run-queue wait' in line and 'of the train phase' in line
    assert f"of the {len(allowed_cpus())} CPUs this process may use busy" in line and 'a quiet machine may give another verdict' in line
    d = diagnose(learn)
    lines = d.lines()  # the diagnosis says it first, before its verdict, in two lines at most; in full in its evidence
    assert lines[0] == d.preface and lines[0].startswith('Busy machine: the main thread waited for a CPU ') and len(lines[0]) <= 196
    assert lines[1].startswith('Bound by '), lines[:2]
    assert d.preface_full == line and line in d.evidence()

# The runs of the notebook's table (a tabular learner, 2 CPUs, 2 torch threads): wall s, the main thread's wait s, others' CPU s, own CPUs, switches
MEASURED = {'quiet': (.98, .001, .01, 1.99, 33), '1 spinner': (3.46, 1.2, 2.5, 1.27, 718), '2 spinners': (9.83, 5., 9.8, .97, 2523),
            '2 spinners and other users': (101.2, 75.8, 99., .47, 29250)}

def _load(wall, wait, other, cpu=1., switches=100., cpus=2, **kw) -> MachineLoad:
    "A `MachineLoad` whose train phase is the whole call: the main thread waited `wait` s of `wall`, other processes used `other` CPU s"
    s = MachineSpan(wall=wall, run=wall - wait, wait=wait, slices=switches, switches=switches, cpu=cpu*wall, busy=cpu*wall + other, steal=0.)
    return MachineLoad(cpus=cpus, machine_cpus=cpus, call=s, phases={'train': s, 'valid': s._replace(wall=wall/10)}, **kw)

@pytest.mark.parametrize('name', MEASURED)
def test_the_measured_runs_are_told_apart(name):
    m = _load(*MEASURED[name])
    assert m.busy() == (name != 'quiet')
    assert (m.line() is None) == (name == 'quiet')
    if name != 'quiet': assert m.line().startswith('Busy machine:') and 'went to that wait' in m.line()

@pytest.mark.parametrize('wall,wait,other,cpus,busy', [
    (10., .1, 20., 2, False),  # others kept 2 CPUs busy, the main thread waited 1%: a big machine with room
    (10., 5., 2., 2, False),  # it waited half the time, others used 0.2 CPU: it competes with its own threads and workers
    (10., 1., 5., 2, True),  # at both thresholds: 10% and 0.5 CPU
    (10., .99, 5., 2, False), (10., 1., 4.9, 2, False),  # just under either
    (10., 4., 40., 64, True),  # 4 of 64 CPUs' worth of others, and the wait: busy wherever the wait is
])
def test_busy_needs_the_wait_and_the_others(wall, wait, other, cpus, busy):
    assert _load(wall, wait, other, cpus=cpus).busy() == busy

def test_the_line_says_what_it_cost_and_what_was_not_measured():
    m = _load(*MEASURED['2 spinners'])
    assert m.line() == ("Busy machine: the main thread waited for a CPU 51% of the call's 9.83 s (run-queue wait, /proc/self/task/<tid>/schedstat; "
                        "2,523 involuntary context switches, 257/s): 51% of the train phase's 9.83 s went to that wait. Other processes kept 1.0 "
                        "of the 2 CPUs this process may use busy. The times below include that wait: a quiet machine may give another verdict.")
    assert math.isclose(m.cpu_share('train'), 1 - 5/9.83) and m.cpu_share('no such phase') is None
    st = _load(*MEASURED['2 spinners']); st.call = st.phases['train'] = st.call._replace(steal=2.)
    assert 'and a hypervisor took 0.2 (steal)' in st.line()
    nw = _load(10., 5., 10., unmeasured={'wait': 'no /proc/self/task/7/schedstat'})  # /proc/stat read, the schedstat not
    nw.call = nw.phases['train'] = nw.call._replace(wait=math.nan)
    assert nw.busy() and 'run-queue wait not measured (no /proc/self/task/7/schedstat)' in nw.line()
    nw.call = nw.phases['train'] = nw.call._replace(cpu=2., busy=12.)  # this process 0.2 CPU and the others 1.0, of 2: not full
    assert not nw.busy() and nw.line() is None
    assert MachineProbe.empty().line() is None and not MachineProbe.empty().busy()  # a profile saved before the probe

def _same(a, b) -> bool:
    "Equal, NaN equal to NaN"
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

def _span_differences(name:str, x:MachineSpan, y) -> list:
    if type(y) is not MachineSpan: return [f"{name}: a {type(y).__name__}, not a MachineSpan"]
    return [f"{name}.{k}: {u!r} read back as {v!r}" for k,u,v in zip(MachineSpan._fields, x, y) if not _same(u, v)]

def _differences(a:MachineLoad, b:MachineLoad) -> list:
    "Where `b` differs from `a`, field by field (each span's too)"
    out = []
    for f in fields(MachineLoad):
        x,y = getattr(a, f.name),getattr(b, f.name)
        if f.name == 'call': out += _span_differences('call', x, y)
        elif f.name == 'phases':
            if set(x) != set(y): out.append(f"phases {set(x)} read back as {set(y)}")
            else: out += [d for p in x for d in _span_differences(f"phases[{p!r}]", x[p], y[p])]
        elif type(x) is not type(y) or not _same(x, y): out.append(f"{f.name}: {x!r} read back as {y!r}")
    return out

def test_its_facts_read_back_field_by_field(tmp_path):
    learn = _learner(n_trn=64)
    m = _profile(learn, epochs=2)
    assert set(m.phases) == {'train', 'valid'} and m.call.wall >= sum(s.wall for s in m.phases.values()) > 0
    back = MachineProbe.from_json(json.loads(json.dumps(MachineProbe.to_json(m), allow_nan=False)))
    assert _differences(m, back) == []
    unmeasured = _load(*MEASURED['1 spinner'], unmeasured={'wait': 'no /proc'}); unmeasured.call = unmeasured.call._replace(wait=math.nan, busy=math.nan)
    back = MachineProbe.from_json(json.loads(json.dumps(MachineProbe.to_json(unmeasured), allow_nan=False)))
    assert _differences(unmeasured, back) == [] and math.isnan(back.call.wait)
    loaded = load_profile(learn.simple_profile.save(tmp_path/'run.json')).facts.machine  # the whole profile, saved and loaded
    assert type(loaded) is MachineLoad and _differences(m, loaded) == []

def test_where_proc_is_missing_it_says_what_was_not_measured(monkeypatch, tmp_path):
    missing = str(tmp_path/'no-proc')
    monkeypatch.setattr(machine, 'PROC', missing)
    learn = _learner(n_trn=64)
    m = _profile(learn)
    assert m.unmeasured == {'threads': f'no {missing}', 'wait': f'no {missing}', 'other': f'no {missing}'}
    assert m.wait_share() is None and m.other_cpus() is None and not m.busy()
    assert m.cpu_share('train') > 0 and m.call.switches >= 0  # the main thread's CPU time and getrusage remain
    assert m.line().startswith(f"Machine load not measured (no {missing}): the run-queue wait and other processes' CPU use are unknown. "
                               "The main thread ran ") and 'involuntary context switches' in m.line()
    d = diagnose(learn)  # not a busy machine: said where the diagnosis says what it rests on, not before its verdict
    assert d.preface is None and d.lines()[0].startswith('Bound by ') and m.line() in d.basis, d.basis

def _burn(ready, seconds):
    "A child process that uses `seconds` of CPU, says so, and waits to be stopped"
    t = time.process_time()
    while time.process_time() - t < seconds: pass
    ready.set()
    time.sleep(60)

def test_a_running_worker_counts_as_the_process_own():
    "The loader's workers are `multiprocessing` children: their CPU time is the process's, not other processes'"
    ready = multiprocessing.Event()
    p = multiprocessing.Process(target=_burn, args=(ready, .3), daemon=True)
    before = running_children()
    p.start()
    try:
        assert ready.wait(60)
        assert running_children() - before >= .25  # /proc counts in 10 ms ticks
    finally: p.kill(); p.join()

def test_it_reads_at_the_boundaries_only():
    """Never per batch: once at the call's start and end, and at each phase's start and end (a validation starts where its epoch's training
    phase ended: one reading serves both)"""
    class Counted(MachineProbe):
        reads = 0
        def read(self, *a): Counted.reads += 1; return super().read(*a)
    learn = _learner(n_trn=160)  # 10 training batches, 3 valid, a fit
    s = session_for(learn, logger_callback=None, show_report=False)
    s.probes = [Counted() if isinstance(p, MachineProbe) else p for p in s.probes]
    s.arm(); learn.fit(2)
    assert Counted.reads == 2 + 2*3  # the call; 2 epochs x (train start, train end = valid start, valid end)
    m = learn.simple_profile.facts.machine
    assert set(m.phases) == {'train', 'valid'} and m.phases['valid'].wall > 0
    assert m.phases['train'].wall + m.phases['valid'].wall <= m.call.wall  # the phases within the call, apart
    assert not MachineProbe.per_batch and not isinstance(Counted(), Callback)

def _weights(machine_probe:bool) -> list:
    set_seed(0)
    learn = _learner(n_trn=64)
    _profile(learn, machine_probe, epochs=2)
    return [p.detach().clone() for p in learn.model.parameters()]

def test_it_never_changes_training():
    a,b = _weights(True),_weights(False)
    assert all(torch.equal(x, y) for x,y in zip(a, b))

def test_a_busy_machine_is_a_warning_above_the_verdict_in_every_renderer():
    "The verdict stays the headline (HTML, markdown, the terminal's bold line); the busy machine is said above it"
    from fastprofile.engine.core import Facts, ProfileResult
    from fastprofile.engine.record import ProfileRecord
    from fastprofile.testing import FakeClock, drive_record
    from fastprofile.analysis.diagnosis import diagnosis_section
    from fastprofile.engine.tables import _html_section, _md_section
    clock = FakeClock()
    rec = drive_record(ProfileRecord(warmup=0, clock=clock), clock, n_train=10, n_valid=2)
    for m,preface in ((_load(*MEASURED['2 spinners']), 1), (_load(*MEASURED['quiet']), 0)):
        sec = diagnosis_section(ProfileResult(rec, Facts(num_workers=0, cpus=2, machine=m)))
        assert sec.preface == preface and sec.lines[preface].startswith('Bound by ')
        h,md = _html_section(sec),_md_section(sec)
        assert re.search(r'<p class="fp-headline">Bound by ', h) and ('<p class="fp-warn">Busy machine: ' in h) == bool(preface)
        assert re.search(r'\n\*\*Bound by ', md) and ('> Busy machine: ' in md) == bool(preface)
        if preface: assert h.index('fp-warn') < h.index('fp-headline') and md.index('> Busy machine') < md.index('**Bound by')

def test_the_0_2_0_names_of_the_preface_still_read():
    "`Diagnosis.machine` and `machine_detail`, 0.2.0's names, read what the probes say before the verdict, with a `DeprecationWarning`"
    from fastprofile.engine.core import Facts, ProfileResult
    from fastprofile.engine.record import ProfileRecord
    from fastprofile.testing import FakeClock, drive_record
    clock = FakeClock()
    rec = drive_record(ProfileRecord(warmup=0, clock=clock), clock, n_train=10, n_valid=2)
    d = diagnose(ProfileResult(rec, Facts(num_workers=0, cpus=2, machine=_load(*MEASURED['2 spinners']))))
    assert d.preface.startswith('Busy machine: ') and d.preface_full == _load(*MEASURED['2 spinners']).line()
    with pytest.warns(DeprecationWarning, match=r'`Diagnosis.machine` is now `Diagnosis.preface`'): assert d.machine == d.preface
    with pytest.warns(DeprecationWarning, match=r'machine_detail` is now `Diagnosis.preface_full`'): assert d.machine_detail == d.preface_full
