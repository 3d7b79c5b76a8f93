"""`python -m bench batch`: the batch-size model's predictions against measured A/B runs, on four CPU workloads.

For each workload: a profiled fit at its batch size `bs`; the diagnosis' named batch size `N` (its per-batch finding) and the
speedup per sample it predicts (the model predicts every measured size: the table shows `N`'s, or the largest measured when
no size is named); then fits at `bs` and at that size on the same learner, interleaved, `trials` of each after one untimed
of each, timed per sample by the profiler (steady state: past the warm-up, draw + batch, as `check_advice` measures) and as
whole fits (wall clock over every sample, train and valid); and `check_advice` on a fresh learner, its own prediction and
measurement. Ratios are taken within one run. Progress goes to stderr; the markdown table to stdout."""
from __future__ import annotations
import argparse, math, statistics, sys, time, warnings
from .common import machine_info, machine_md, md_table, fmt

def tabular(bs:int=64, n:int=6000):
    "fastai's `tabular_learner`, layers [200,100], on `n` synthetic rows (2 categorical, 3 continuous columns), 20% validation"
    import numpy as np, pandas as pd
    from fastai.tabular.all import TabularDataLoaders, tabular_learner, Categorify, FillMissing, Normalize, CategoryBlock, accuracy
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'a': rng.choice(list('abcde'), n), 'b': rng.choice(list('xyz'), n), 'c': rng.normal(size=n),
                       'd': rng.normal(size=n), 'e': rng.normal(size=n)})
    df['y'] = (df.c + rng.normal(size=n) > 0).astype(int)
    dls = TabularDataLoaders.from_df(df, procs=[Categorify, FillMissing, Normalize], cat_names=['a','b'], cont_names=['c','d','e'],
                                     y_names='y', y_block=CategoryBlock(), bs=bs, valid_idx=list(range(int(n*.8), n)))
    return tabular_learner(dls, layers=[200,100], metrics=accuracy)

def _tensor_learner(x, y, model, bs, loss, n_valid):
    from fastai.basics import DataLoaders, Learner
    items = list(zip(x, y))
    dls = DataLoaders.from_dsets(items[:-n_valid], items[-n_valid:], bs=bs, num_workers=0, shuffle=True)
    return Learner(dls, model, loss_func=loss)

def cnn(bs:int=32, n:int=2560):
    "A small CNN (two 3×3 convolutions, 16 and 32 channels) on `n` synthetic 3×32×32 images in memory, 10 classes"
    import torch
    from torch import nn
    from fastai.basics import CrossEntropyLossFlat
    g = torch.Generator().manual_seed(0)
    x,y = torch.randn(n, 3, 32, 32, generator=g),torch.randint(0, 10, (n,), generator=g)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return _tensor_learner(x, y, m, bs, CrossEntropyLossFlat(), n//5)

class _TextNet(__import__('torch').nn.Module):
    "Embedding 2,000×64, an LSTM 64→64, the last state to 2 classes"
    def __init__(self):
        super().__init__()
        from torch import nn
        self.emb,self.rnn,self.head = nn.Embedding(2000, 64),nn.LSTM(64, 64, batch_first=True),nn.Linear(64, 2)
    def forward(self, x):
        out,_ = self.rnn(self.emb(x))
        return self.head(out[:, -1])

def text(bs:int=32, n:int=2560, seq:int=48):
    "A text classifier (embedding, LSTM, linear head) on `n` synthetic token-id sequences of `seq` tokens"
    import torch
    from fastai.basics import CrossEntropyLossFlat
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2000, (n, seq), generator=g)
    y = (x[:, 0] % 2)
    return _tensor_learner(x, y, _TextNet(), bs, CrossEntropyLossFlat(), n//5)

def demo(bs:int=32):
    "The demo: `fastprofile.demo.make_demo_learner` (JPEGs decoded with PIL, a small CNN), 1,280 + 256 images, no workers"
    from .common import demo_learner
    return demo_learner(n_train=1280, n_valid=256, bs=bs)

WORKLOADS = {'tabular': (tabular, 64), 'cnn': (cnn, 32), 'text': (text, 32), 'demo': (demo, 32)}

def _quiet(learn):
    from .common import quiet
    return quiet(learn)

def _fit(learn, bs:int) -> tuple:
    "One profiled epoch at batch size `bs`: (steady seconds per sample, whole-fit seconds per sample)"
    from fastprofile.fixes.advice import _per_sample
    for dl in learn.dls.loaders: dl.bs = bs
    learn.profile(logger_callback=None, show_report=False)
    t0 = time.perf_counter()
    learn.fit(1)
    wall = time.perf_counter() - t0
    ps = _per_sample(learn.simple_profile.record)
    n = sum(s for _,s in ps.values())
    items = len(learn.dls.train.dataset)//bs*bs + len(learn.dls.valid.dataset)  # drop_last in training
    return sum(t*s for t,s in ps.values())/n,wall/items

def one(name:str, trials:int=3, log=print) -> dict:
    "Predicted and measured speedups per sample of the named batch size for workload `name`"
    import fastprofile.all  # noqa: F401 (`Learner.profile`)
    from fastprofile.analysis.diagnosis import diagnose
    from fastprofile.fixes.advice import check_advice
    make,bs = WORKLOADS[name]
    learn = _quiet(make(bs))
    learn.profile(logger_callback=None, show_report=False).fit(1)
    d = diagnose(learn)
    bsc = d.numbers.get('batch_sizes') or {}
    pred = bsc.get('predicted', {})
    named = next((f.change['value'] for f in d.findings if (f.change or {}).get('kind') == 'batch_size'), None)
    n = named or (max(pred) if pred else None)
    out = dict(workload=name, bs=bs, verdict=d.verdict, named=named, size=n, predicted=pred.get(n, math.nan), all_predicted=pred,
               measured_at=bsc.get('sizes'), measure_seconds=bsc.get('seconds'))
    if n is None: return out
    steady,whole = {bs:[], n:[]},{bs:[], n:[]}
    for k in (bs, n): _fit(learn, k)  # untimed: each size's first fit
    for t in range(trials):
        for k in (bs, n):
            s,w = _fit(learn, k)
            steady[k].append(s); whole[k].append(w)
        log(f"[batch] {name} trial {t+1}/{trials}: bs {bs} {steady[bs][-1]*1e6:.1f} µs/sample, bs {n} {steady[n][-1]*1e6:.1f} µs/sample")
    ratios = [a/b for a,b in zip(steady[bs], steady[n])]
    out.update(measured=statistics.median(ratios), measured_min=min(ratios), measured_max=max(ratios),
               whole=statistics.median([a/b for a,b in zip(whole[bs], whole[n])]))
    learn2 = _quiet(make(bs))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn2.profile(logger_callback=None, show_report=False).fit(1)
        c = check_advice(learn2, resource='per_batch') if named else None
    if c is not None and c.change is not None: out.update(check_predicted=c.predicted, check_measured=c.measured, check_size=c.change['value'])
    return out

def leads(name:str, runs:int=3, log=print) -> list:
    "The lead finding of `runs` fresh profiles of workload `name` (`fit_one_cycle(1)`, the report's own diagnosis): is it the same each time?"
    import fastprofile.all  # noqa: F401 (`Learner.profile`)
    from fastprofile.analysis.diagnosis import diagnose
    make,bs = WORKLOADS[name]
    out = []
    for i in range(runs):
        learn = _quiet(make(bs))
        learn.profile(logger_callback=None, show_report=False).fit_one_cycle(1)
        d = diagnose(learn)
        out.append(dict(run=i+1, verdict=d.verdict, change=d.change, predicted=d.predicted_speedup, busy=d.machine is not None))
        log(f"[batch] {name} run {i+1}: {d.verdict} {d.change} {d.predicted_speedup:.2f}x" + (' (busy machine)' if d.machine else ''))
    return out

def table(rows:list) -> str:
    hs = ['workload', 'bs', 'verdict', 'size named', 'predicted', 'measured (steady, median [min-max])', 'error', 'measured (whole fit)',
          'check_advice: size, predicted / measured']
    body = []
    for r in rows:
        err = r.get('predicted', math.nan)/r['measured'] - 1 if r.get('measured') else math.nan
        ca = (f"bs {r['check_size']}: {r['check_predicted']:.2f}x / {r['check_measured']:.2f}x" if 'check_measured' in r else '—')
        body.append([r['workload'], r['bs'], r['verdict'], r['named'] or f"none (largest measured: {r['size']})",
                     fmt(r.get('predicted'), '.2f', 'x'),
                     f"{r['measured']:.2f}x [{r['measured_min']:.2f}-{r['measured_max']:.2f}]" if 'measured' in r else '—',
                     fmt(100*err, '+.0f', '%'), fmt(r.get('whole'), '.2f', 'x'), ca])
    return md_table(hs, body)

def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.batch', description=__doc__.splitlines()[0])
    ap.add_argument('workloads', nargs='*', help=f"any of {', '.join(WORKLOADS)} (default: all)")
    ap.add_argument('--trials', type=int, default=3)
    ap.add_argument('--leads', type=int, default=0, help="instead: the lead finding of this many fresh profiles of each workload")
    a = ap.parse_args(argv)
    bad = [w for w in a.workloads if w not in WORKLOADS]
    if bad: ap.error(f"unknown workload(s) {', '.join(bad)}: valid are {', '.join(WORKLOADS)}")
    log = lambda s: print(s, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if a.leads:
        rows = [dict(workload=w, **r) for w in (a.workloads or WORKLOADS) for r in leads(w, a.leads, log)]
        print(md_table(['workload', 'run', 'verdict', 'change', 'predicted', 'busy machine'],
                       [[r['workload'], r['run'], r['verdict'], r['change'], fmt(r['predicted'], '.2f', 'x'), r['busy']] for r in rows]))
        return rows
    rows = [one(w, a.trials, log) for w in (a.workloads or WORKLOADS)]
    print(machine_md(machine_info()) + f"\n\nCommand: `python -m bench.batch{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}` "
          f"({time.perf_counter() - t0:.0f} s).\n")
    print(table(rows))
    return rows

if __name__ == '__main__': main()
