"A profiled 2-rank DDP fit on CPU (gloo), launched by tests/test_distributed.py with torchrun; writes results to OUT"
import argparse, json, os, time, warnings
from datetime import timedelta
from pathlib import Path
import torch
from torch.utils.data import Dataset
from accelerate.utils import InitProcessGroupKwargs
from fastai.basics import *
from fastai.distributed import *
from fastai.test_utils import RegModel
import fastprofile.engine.core, fastprofile.learner  # `Learner.profile`
from fastprofile.engine.record import ProfileRecord, Row
from fastprofile.analysis.distributed import MergedRecord, fix_cpu_broadcast, distributed_world, save_merged_trace

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

class AtFitEnd(Callback):
    "At `after_fit`, after DDP's last collective: sleep `late` seconds, then raise if `fail`"
    order = 100
    def __init__(self, late=0., fail=False): self.late,self.fail = late,fail
    def after_fit(self):
        time.sleep(self.late)
        if self.fail: raise RuntimeError('this rank failed at the end of its fit')

class Stamp(Callback):
    "Last at `after_fit`: when this rank's fit (and `AtFitEnd`) ended, before the profile is gathered"
    order = 2000
    def after_fit(self): self.t = time.monotonic()

def shift_profile_clock(shift):
    "Every `Profile` made from now on in this process has a wall clock reading `shift` seconds ahead"
    init = fastprofile.engine.core.Profile.__init__
    def shifted(self, *args, **kwargs): init(self, *args, **{'clock': lambda: time.perf_counter() + shift, **kwargs})
    fastprofile.engine.core.Profile.__init__ = shifted

def main():
    p = argparse.ArgumentParser()
    p.add_argument('out', type=Path)
    p.add_argument('--slow-rank', type=int, default=-1)  # this rank's items each sleep --delay seconds
    p.add_argument('--delay', type=float, default=.002)
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--prefetch', action='store_true')  # CudaPrefetchCallback staging on CPU (LoggingOps)
    p.add_argument('--clock-shift', type=float, default=0.)  # rank r's profiler clock reads r*shift seconds ahead
    p.add_argument('--break-rank', type=int, default=-1)  # this rank cannot pack its profile for the gather
    p.add_argument('--fail-rank', type=int, default=-1)  # this rank's fit raises at its end; the script catches it ...
    p.add_argument('--then-sleep', type=float, default=0.)  # ... and goes on running (sleeps) this long
    p.add_argument('--late-rank', type=int, default=-1)  # this rank reaches the end of its call --late seconds after the others
    p.add_argument('--late', type=float, default=0.)
    p.add_argument('--gather-timeout', type=float, default=20.)
    p.add_argument('--pg-timeout', type=float, default=60.)  # the process group's own timeout (collectives, barriers)
    p.add_argument('--telemetry', action='store_true')  # each rank's telemetry sampler on (CPU readings, every 5 ms)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ['RANK'])
    if rank == a.break_rank:
        def broken(self): raise RuntimeError('cannot pack this profile')
        ProfileRecord.state = broken
    if a.clock_shift: shift_profile_clock(rank*a.clock_shift)  # as if each process's clock had its own origin
    delay = a.delay if rank == a.slow_rank else 0.
    torch.manual_seed(0)
    dls = DataLoaders(TfmdDL(SlowDataset(128, delay), bs=8, shuffle=True, num_workers=0),
                      TfmdDL(SlowDataset(64, delay), bs=8, num_workers=0))
    learn = Learner(dls, RegModel(), loss_func=MSELossFlat(), opt_func=partial(SGD, mom=0.9), lr=1e-2,
                    path=a.out/f'rank{rank}')
    if a.prefetch:  # on the learner: the facts of the call are collected after `fit(cbs=...)` took its callbacks off
        from fastprofile.data.prefetch import CudaPrefetchCallback, LoggingOps
        learn.add_cb(CudaPrefetchCallback(ops=LoggingOps()))
    stamp = Stamp()
    cbs = [stamp, AtFitEnd(a.late if rank == a.late_rank else 0., rank == a.fail_rank)]
    learn.profile(plain=True, save_csv=True, logger_callback=None, rank_csv=True, gather_timeout=a.gather_timeout,
                  **(dict(telemetry=True, telemetry_every=.005) if a.telemetry else {}))
    assert fix_cpu_broadcast()
    outcome = 'ok'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        try:
            with learn.distrib_ctx(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=a.pg_timeout))]):
                r,world = distributed_world()
                learn.fit(a.epochs, cbs=cbs)
        except RuntimeError as e:
            if rank != a.fail_rank: raise
            outcome = f'{type(e).__name__}: {e}'
        t_end = time.monotonic()
        if outcome != 'ok': time.sleep(a.then_sleep)  # caught its error, and goes on with something else
    res = learn.simple_profile
    rec = res.record
    info = dict(rank=rank, world=world, outcome=outcome, gathered=isinstance(rec, MergedRecord),
                tail_seconds=t_end - getattr(stamp, 't', t_end),  # end of the fit to the end of the call: the gather (and report)
                missing=getattr(rec, 'missing_ranks', None), missing_why=getattr(rec, 'missing_why', None),
                gather_seconds=getattr(rec, 'gather_seconds', None),
                warnings=[str(w.message) for w in caught if 'fastprofile' in str(w.message)],
                report=res.report.plain(width=1000), device=str(next(learn.model.parameters()).device))  # wide: one line per note
    if isinstance(rec, MergedRecord):
        info.update(ranks=[p.rank for p in rec.ranks], offsets=[p.offset for p in rec.ranks],
                    stragglers=rec.stragglers, calls=int(rec.stats[Row('train','draw')].n),
                    rank_calls=[int(p.record.stats[Row('train','draw')].n) for p in rec.ranks],
                    rank_samples=[int(p.record.samples[Row('fit','train')]) for p in rec.ranks],
                    samples=int(rec.samples[Row('fit','train')]),
                    telemetry_samples=[getattr(p.record.telemetry, 'samples', None) for p in rec.ranks])
        spread = res.section('Distributed')
        if spread is not None: spread.to_csv(a.out/'spread.csv', index=False)
        save_merged_trace(rec, a.out/'trace.json')
    (a.out/f'rank{rank}.json').write_text(json.dumps(info, default=str))

if __name__ == '__main__': main()
