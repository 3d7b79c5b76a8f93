"""`atomic_write` leaves no temporary file behind wherever an interrupt lands, and the target is either the old file,
complete, or the new one, complete (or absent where there was none). A `KeyboardInterrupt` is raised at the k-th
event of a trace hook, for every k the write goes through: `sys.settrace` (each line, call and return of Python code,
`tempfile`'s and `os`'s included) and `sys.setprofile` (each call and return of a C function: right after `os.open`
made the file and before its descriptor is stored, right after `os.replace`). Real files, a real folder."""
import os, sys, pytest
import pandas as pd
from fastprofile.engine.tables import atomic_write, atomic_write_text, atomic_write_csv

class _Interrupt:
    "A trace or profile hook that raises `KeyboardInterrupt` at its `k`-th event, once"
    def __init__(self, k): self.k,self.n,self.fired = k,0,False
    def __call__(self, frame, event, arg):
        self.n += 1
        if self.n == self.k and not self.fired:
            self.fired = True
            raise KeyboardInterrupt(f'event {self.k}: {event} in {frame.f_code.co_name}')
        return self  # settrace: trace the frame's lines too

def _run(setter, k, write):
    "Run `write()` under `setter` (sys.settrace or sys.setprofile) raising at event `k`; (events seen, interrupted)"
    hook = _Interrupt(k)
    setter(hook)
    try: write()
    except KeyboardInterrupt: pass
    finally: setter(None)
    return hook.n, hook.fired

def _left(folder):  return sorted(f.name for f in folder.iterdir() if f.name.endswith('.tmp'))

@pytest.mark.parametrize('setter', [sys.settrace, sys.setprofile], ids=['lines', 'c-calls'])
@pytest.mark.parametrize('old', [None, 'old contents\n'], ids=['new-file', 'over-a-file'])
def test_interrupt_anywhere_leaves_no_temporary_file(tmp_path, setter, old):
    "At every event of the write: no `.tmp` left; the target old and complete, new and complete, or absent"
    new = 'fit,' * 200 + '\n'
    target = tmp_path/'out'/'.simple_profile.csv'
    write = lambda: atomic_write_text(new, target)
    total,fired = _run(setter, 10**9, write)  # an uninterrupted run counts the events
    assert not fired and total > 20, total
    ok = 0
    for k in range(1, total+2):
        if old is None: target.unlink(missing_ok=True)
        else: target.parent.mkdir(exist_ok=True); target.write_text(old)
        seen,fired = _run(setter, k, write)
        assert _left(target.parent) == [], f"interrupted at event {k} of {total}: left {_left(target.parent)}"
        got = target.read_text() if target.exists() else None
        assert got in {new, old}, f"interrupted at event {k}: the target holds {got!r:.60}"
        ok += fired
    assert ok >= total - 2  # the interrupt landed at (nearly) every event: the hook saw the whole write

def test_interrupt_in_the_writer(tmp_path):
    "A writer interrupted after part of its output: the old file stays, complete, and nothing else is there"
    target = tmp_path/'profile.csv'
    atomic_write_text('old\n', target)
    def half(f): f.write('a,b\n'); f.flush(); raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): atomic_write(target, half)
    assert sorted(f.name for f in tmp_path.iterdir()) == ['profile.csv'] and target.read_text() == 'old\n'

def test_interrupt_in_a_csv_write(tmp_path):
    "The same at every Python line of pandas' `to_csv` (the profile's CSV), sampled every 7th event"
    df = pd.DataFrame({'Phase': ['fit', 'train'], 'Total Time': [1.5, 0.25]})
    target = tmp_path/'p.csv'
    total,_ = _run(sys.settrace, 10**9, lambda: atomic_write_csv(df, target))
    target.unlink()
    for k in range(1, total+1, 7):
        _run(sys.settrace, k, lambda: atomic_write_csv(df, target))
        assert _left(tmp_path) == [], f"interrupted at event {k} of {total}"
        if target.exists(): pd.testing.assert_frame_equal(pd.read_csv(target), df); target.unlink()

def test_permissions_and_name(tmp_path):
    "The file gets the usual permissions under the umask; the temporary name is beside it and starts like it"
    seen = []
    p = atomic_write(tmp_path/'a.txt', lambda f: seen.append(sorted(x.name for x in tmp_path.iterdir())) or f.write('x'))
    m = os.umask(0); os.umask(m)
    assert p.stat().st_mode & 0o777 == 0o666 & ~m
    assert len(seen[0]) == 1 and seen[0][0].startswith('.a.txt.') and seen[0][0].endswith('.tmp')
