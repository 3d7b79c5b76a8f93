"""Per-batch cost of logging samples/second every `log_every` batches (wandb offline, TensorBoard) on the demo workload.

For each logger, fits without it (A: `logger_callback=None`) and with it (B) alternate A B A B ... in one process, on
the same learner set-up (the logger's run or fastai callback present in both, so only the profiler's logging differs).
Per-batch time = train-phase wall time / training batches. Reported: the median per-batch time of A and of B, the
median over rounds of (B - A) / A within the round (end to end, but at the mercy of machine noise), and the logger's
own cost measured directly: the time spent inside the logger's `Sink.log_batch` (`WandbSink`, `TensorBoardSink`) per
training batch, over the median A.

    python -m bench.loggers [--rounds 7] [--n-train 1280] [--log-every 10]"""
from __future__ import annotations
import argparse, os, sys, tempfile, time, warnings
from .common import median, iqr, md_table, machine_info, machine_md


class Timed:
    "Wrap the `log_batch` of the sink class that logger `name` uses, to add up the time spent in it"
    def __init__(self, name):
        from fastprofile.sinks.wandb import WandbSink
        from fastprofile.sinks.tensorboard import TensorBoardSink
        self.cls,self.total,self.calls = {'wandb': WandbSink, 'tensorboard': TensorBoardSink}[name],0.,0
        self.orig = self.cls.__dict__['log_batch']
        def timed(sink, record, step, window, _o=self.orig, _t=self):
            t0 = time.perf_counter()
            try: return _o(sink, record, step, window)
            finally: _t.total += time.perf_counter() - t0; _t.calls += 1
        self.cls.log_batch = timed
    def restore(self): self.cls.log_batch = self.orig


def per_batch(learn, logger, log_every):
    "Fit one epoch with the profiler (logging to `logger`); the train phase's wall time per batch"
    learn.profile(show_report=False, logger_callback=logger, log_every=log_every).fit(1)
    from fastprofile.engine.record import Row
    st = learn.simple_profile_record.stats
    n = st[Row('train','batch')].n + st[Row('train','warmup')].n
    return st[Row('fit','train')].total/n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--n-train', type=int, default=1280)
    p.add_argument('--log-every', type=int, default=10)
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix='fastprofile-bench-loggers-')
    os.environ.update({k: tmp for k in ('WANDB_DIR','WANDB_CONFIG_DIR','WANDB_CACHE_DIR','WANDB_DATA_DIR')},
                      WANDB_MODE='offline', WANDB_SILENT='true', WANDB_DISABLE_GIT='true')
    import torch; torch.set_num_threads(1)
    import wandb
    from fastai.basics import set_seed
    from fastai.callback.progress import ProgressCallback
    from fastai.callback.tensorboard import TensorBoardCallback
    from fastprofile.demo import make_demo_learner
    import fastprofile.learner  # noqa: F401 (`Learner.profile`; its `LOGGERS` name the wandb and TensorBoard sinks)
    warnings.simplefilter('ignore')
    info = machine_info()
    print(f"[bench] demo workload: make_demo_learner(n_train={a.n_train}, n_valid=128, bs=64), CPU, 1 thread; "
          f"log_every={a.log_every}; {a.rounds} rounds A B", file=sys.stderr)
    rows = []
    for logger in ('wandb', 'tensorboard'):
        set_seed(0)
        learn = make_demo_learner(n_train=a.n_train, n_valid=128, bs=64, device='cpu')
        learn.remove_cb(ProgressCallback); learn.logger = lambda *_: None
        if logger == 'wandb': wandb.init(project='fastprofile-bench')
        else: learn.add_cb(TensorBoardCallback(os.path.join(tmp, 'tb'), trace_model=False, log_preds=False))
        per_batch(learn, None, a.log_every)  # warm-up fit (JPEG cache, allocator)
        A,B,rel,timer = [],[],[],Timed(logger)
        for r in range(a.rounds):
            ta = per_batch(learn, None, a.log_every)
            tb = per_batch(learn, logger, a.log_every)
            A.append(ta); B.append(tb); rel.append((tb-ta)/ta)
            print(f"[bench] {logger} round {r}: off {ta*1e3:.2f} ms, on {tb*1e3:.2f} ms", file=sys.stderr)
        timer.restore()
        if not timer.calls: raise RuntimeError(f"{logger}: the profiler never logged (no sink made?)")
        direct = timer.total/(a.rounds*len(learn.dls.train))
        if logger == 'wandb': wandb.finish()
        learn.cleanup_demo()
        rows.append([f'`{logger}`', f'{median(A)*1e3:.2f} ms', f'{median(B)*1e3:.2f} ms',
                     f'{100*median(rel):+.2f}%', f'{100*iqr(rel):.2f} pp',
                     f'{direct*1e6:.1f} µs = {100*direct/median(A):.3f}%', f'{timer.calls}',
                     f'{len(learn.dls.train)} × {a.rounds}'])
    print(machine_md(info))
    print(f"Demo workload (`make_demo_learner(n_train={a.n_train}, n_valid=128, bs=64)`, CPU, 1 thread), "
          f"logging every {a.log_every} batches; per-batch time = train-phase time / batches; rounds interleaved A B.\n")
    print(md_table(['logger', 'per batch, not logging (A)', 'per batch, logging (B)', 'overhead (median of (B-A)/A)',
                    'IQR of overhead', 'logger cost per batch (direct), % of A', 'logger calls', 'batches × rounds'], rows))


if __name__ == '__main__': main()
