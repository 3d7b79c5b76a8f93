"A profiled 2-rank DDP fit on CPU (gloo), launched by tests/test_distributed.py with torchrun; writes results to OUT"
import argparse, json, os, pickle, time, warnings
from pathlib import Path
import torch
from torch.utils.data import Dataset
from fastai.basics import *
from fastai.distributed import *
from fastai.test_utils import RegModel
import fastprofile.callback
from fastprofile.callback import SimpleProfilerCallback
from fastprofile.record import ProfileRecord
from fastprofile.distributed import fix_cpu_broadcast, distributed_world, save_merged_trace

class SlowDataset(Dataset):
    "`y = 2x + 3` items; each item sleeps `delay` seconds"
    def __init__(self, n, delay=0.):
        g = torch.Generator().manual_seed(n)
        self.x = torch.randn(n, 1, generator=g)
        self.y,self.delay = 2*self.x + 3,delay
    def __len__(self): return len(self.x)
    def __getitem__(self, i):
        if self.delay: time.sleep(self.delay)
        return self.x[i],self.y[i]

def main():
    p = argparse.ArgumentParser()
    p.add_argument('out', type=Path)
    p.add_argument('--slow-rank', type=int, default=-1)  # this rank's items each sleep --delay seconds
    p.add_argument('--delay', type=float, default=.002)
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--prefetch', action='store_true')  # CudaPrefetchCallback staging on CPU (LoggingOps)
    p.add_argument('--clock-shift', type=float, default=0.)  # rank r's profiler clock reads r*shift seconds ahead
    p.add_argument('--break-rank', type=int, default=-1)  # this rank cannot pack its profile for the gather
    a = p.parse_args()
    rank = int(os.environ['RANK'])
    if rank == a.break_rank:
        import fastprofile.distributed as fd
        def broken(rec): raise RuntimeError('cannot pack this profile')
        fd.record_state = broken
    if a.clock_shift:  # as if each process's clock had its own origin (on one Linux host they share one)
        shift = rank*a.clock_shift
        class ShiftedRecord(ProfileRecord):
            def __init__(self, *args, **kwargs): super().__init__(*args, clock=lambda: time.perf_counter() + shift, **kwargs)
        fastprofile.callback.ProfileRecord = ShiftedRecord
    delay = a.delay if rank == a.slow_rank else 0.
    torch.manual_seed(0)
    dls = DataLoaders(TfmdDL(SlowDataset(128, delay), bs=8, shuffle=True, num_workers=0),
                      TfmdDL(SlowDataset(64, delay), bs=8, num_workers=0))
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), opt_func=partial(SGD, mom=0.9), lr=1e-2,
                    path=a.out/f'rank{rank}')
    cbs = []
    if a.prefetch:
        from fastprofile.prefetch import CudaPrefetchCallback, LoggingOps
        cbs.append(CudaPrefetchCallback(ops=LoggingOps()))
    learn.profile(plain=True, save_csv=True, logger_callback=None)
    prof = next(cb for cb in learn.cbs if isinstance(cb, SimpleProfilerCallback))
    prof.rank_csv = True
    assert fix_cpu_broadcast()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with learn.distrib_ctx(cpu=True):
            learn.fit(a.epochs, cbs=cbs)
            r,world = distributed_world()
    rec = learn.simple_profile_record
    info = dict(rank=rank, world=world, gathered=hasattr(rec, 'ranks'), missing=getattr(rec, 'missing_ranks', None),
                warnings=[str(w.message) for w in caught if 'fastprofile' in str(w.message)],
                report=learn.simple_profile_report.plain(), device=str(next(learn.model.parameters()).device))
    if hasattr(rec, 'ranks'):
        info.update(ranks=[p.rank for p in rec.ranks], offsets=[p.offset for p in rec.ranks],
                    stragglers=rec.stragglers, calls=int(rec.stats[('train','draw')].n),
                    rank_calls=[int(p.record.stats[('train','draw')].n) for p in rec.ranks],
                    rank_samples=[int(p.record.samples[('fit','train')]) for p in rec.ranks],
                    samples=int(rec.samples[('fit','train')]))
        learn.simple_profile_ranks.to_csv(a.out/'spread.csv', index=False)
        save_merged_trace(rec, a.out/'trace.json')
    (a.out/f'rank{rank}.json').write_text(json.dumps(info, default=str))

if __name__ == '__main__': main()
