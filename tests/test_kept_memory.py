"""The memory a kept profile holds does not grow with the data set or the number of batches, measured as a user sees it:
the process's resident memory that `del learn.simple_profile` gives back (after a collection and `malloc_trim`), and
what the allocator counts as in use (`mallinfo2`), after a short fit on a small data set and a long one on a large data
set, each in a fresh process, with the report shown (the batch sizes measured for the diagnosis).

Before this test, releasing the profile of a 20,000-batch fit of 8 gave back 2.3-3.3 MB and that of a 2,000-batch fit
nothing, while the result itself held the same ~0.4 MB: the batch-size measurement's loader copy listed an index per
item of the data set while the result's lazily built parts were being allocated, and those pinned the freed pages. Linux
with glibc only (`malloc_trim`, `mallinfo2`, `/proc/self/statm`)."""
import ctypes, ctypes.util, json, os, subprocess, sys, pytest
from pathlib import Path

ROOT = Path(__file__).parents[1]
MB = 1e6

SCRIPT = r'''
import ctypes, gc, json, sys
import torch
from torch.utils.data import TensorDataset
from fastai.basics import *
from fastprofile.all import *
torch.set_num_threads(1)
import fastprofile.probes.batch_sizes as bsz
# the batch sizes measured whatever the machine's load: a busy machine's slower steps can make the measurement not fit
# in 3% of a short fit, and then it is not started (what this test measures is the memory it leaves)
bsz.BUDGET = (1., *bsz.BUDGET[1:])
items,batches = int(sys.argv[1]),int(sys.argv[2])
libc = ctypes.CDLL('libc.so.6')
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()]
libc.mallinfo2.restype = MallInfo2
def settled():
    "(resident bytes, bytes malloc has in use) once garbage is collected and free memory handed back"
    gc.collect(); libc.malloc_trim(0)
    m = libc.mallinfo2()
    return int(open('/proc/self/statm').read().split()[1])*4096, m.uordblks + m.hblkhd

class Stop(Callback):
    "Ends the epoch after `n` training batches: a long fit of a large data set, cut to the test's time"
    def __init__(self, n): self.n = n
    def after_batch(self):
        if self.training and self.learn.train_iter + 1 >= self.n: raise CancelEpochException

torch.manual_seed(0)
x = torch.randn(items + 64, 2); y = x.sum(1, keepdim=True)
dls = DataLoaders.from_dsets(TensorDataset(x[:items], y[:items]), TensorDataset(x[items:], y[items:]), bs=8, device='cpu')
learn = Learner(dls, nn.Linear(2, 1), loss_func=MSELossFlat(), opt_func=SGD, cbs=Stop(batches))
learn.profile(logger_callback=None)  # the report shown (into this process's pipe), as a user runs it
with learn.no_bar(): learn.fit(1)
assert learn.simple_profile.facts.batch_sizes.measured  # the diagnosis measured the batch sizes
rss0,used0 = settled()
del learn.__dict__['simple_profile']  # what `del learn.simple_profile` would do (the property has no deleter)
rss1,used1 = settled()
print(json.dumps(dict(rss=rss0 - rss1, used=used0 - used1)))
'''

def _libc_ok() -> bool:
    try: lib = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    except OSError: return False
    return hasattr(lib, 'malloc_trim') and hasattr(lib, 'mallinfo2') and os.path.exists('/proc/self/statm')

def _start(items:int, batches:int):
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    return subprocess.Popen([sys.executable, '-c', SCRIPT, str(items), str(batches)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

def _freed(p) -> dict:
    out,err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])

@pytest.mark.skipif(not sys.platform.startswith('linux') or not _libc_ok(), reason="needs Linux with glibc's malloc_trim and mallinfo2")
def test_kept_profile_does_not_grow_with_the_data_set():
    "Releasing a long fit's profile (800,000 samples, 1,200 batches) gives back what a short one's does (2,000 samples, 250 batches)"
    short,long = _start(2_000, 250),_start(800_000, 1_200)  # each in its own process, side by side
    s,l = _freed(short),_freed(long)
    for k,v in (('short', s), ('long', l)): assert v['used'] < 1*MB, (k, v)  # what the result itself holds: ~0.4 MB
    assert l['rss'] - s['rss'] < .6*MB, f"a long fit's kept profile holds {(l['rss'] - s['rss'])/MB:.2f} MB more memory: {l} against {s}"
