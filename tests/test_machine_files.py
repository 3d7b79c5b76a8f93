"""`MachineProbe` reads /proc through descriptors it keeps open for the call (a reading costs a `pread`, not an `open`):
they are closed when the call ends, however it ends, and a reading through them is what a fresh read of the file gives."""
import os, sys, threading, pytest
from collections import Counter
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastprofile.all import *
import fastprofile.probes.machine as machine
from fastprofile.probes.machine import MachineProbe

pytestmark = pytest.mark.skipif(not os.path.exists('/proc/self/fd'), reason="needs Linux's /proc")

def _proc_fds() -> Counter:
    "This process's descriptors open on a file under /proc/ (its own listing's left out), counted by file"
    out = Counter()
    for fd in os.listdir('/proc/self/fd'):
        try: target = os.readlink(f'/proc/self/fd/{fd}')
        except OSError: continue  # the listing's own descriptor, closed meanwhile
        if target.startswith('/proc/') and not target.startswith('/proc/self/fd'): out[target] += 1
    return out

class Stop(Callback):
    "A Ctrl-C in the middle of the first training batch"
    def after_pred(self): raise KeyboardInterrupt

class Seen(Callback):
    "The /proc files open in the middle of the fit"
    def after_pred(self): Seen.fds = _proc_fds()

def test_descriptors_open_during_the_call_closed_after_it():
    before = _proc_fds()
    learn = synth_learner(n_trn=64, n_val=16, cbs=Seen())
    learn.profile(show_report=False, logger_callback=None).fit(1)
    assert any(f.endswith('/stat') for f in Seen.fds - before)  # kept open in the fit: the readings use them
    assert _proc_fds() == before
    assert learn.simple_profile.facts.machine.phases['train'].wall > 0

def test_closed_after_an_interrupted_call():
    before = _proc_fds()
    learn = synth_learner(n_trn=64, n_val=16, cbs=Stop())
    with pytest.raises(KeyboardInterrupt): learn.profile(show_report=False, logger_callback=None).fit(1)
    assert _proc_fds() == before
    assert learn.simple_profile.facts.machine.call.wall > 0  # the call's span, up to the interrupt

def test_a_reading_through_a_kept_descriptor_is_a_fresh_one():
    "The kept descriptor is read from its start each time: the counters move on as a fresh read's do"
    tid = threading.get_native_id()
    p = MachineProbe()
    try:
        a = machine._schedstat(p._proc(f'self/task/{tid}/schedstat'))
        sum(i*i for i in range(300_000))  # some CPU time for this thread
        b = machine._schedstat(p._proc(f'self/task/{tid}/schedstat'))
        c = machine.schedstat(tid)
        assert a[0] < b[0] <= c[0] and b[2] <= c[2]
        busy,_ = machine._cpu_stat(p._proc('stat'), machine.allowed_cpus())
        assert busy == pytest.approx(machine.cpu_stat(machine.allowed_cpus())[0], abs=1.)
    finally: p._close()
    assert p._fds == {}
