"""`python -m bench verdict`: the verdict as a person reads it, printed into a pipe at 100 columns, on a set of workloads.

For each workload, a child process (stdout a pipe, `COLUMNS=100`) runs `learn.profile().fit(1)` with the report shown (the
default) and prints it as a user sees it; this process reads the *Diagnosis* section out of that text and checks it against
the verdict's goals:
- the printed section (its title, its lines as wrapped, the evidence hint) is at most 12 lines;
- the headline is at most 100 characters and carries the verdict's share; a busy-machine warning is 1-2 lines;
- the first fix's code span is within the first 3 lines after the busy warning, its speedup (and kind) on its line or the next;
- no printed sentence over 160 characters; no line said twice;
- in Jupyter, at most 900 characters of the diagnosis outside its collapsed evidence (`<details>`).

Workloads: the test suite's scenarios (`input`, `compute`, `optimizer`, `metric`, `callback`: a 1-parameter model whose
loader, forward, optimizer step, metric or callback sleeps; `tabular`: fastai's `tabular_learner` on 20,000 rows at bs 64, per-batch bound)
and three the tests do not name: `tab_metric` (a tabular learner with a 10 ms metric), `embed` (an embedding-bag text
classifier on synthetic token ids with 2 loader workers) and `demo` (`fastprofile demo`'s JPEG learner, ~20 s).

    python -m bench verdict [NAME ...] [--runs N] [--json FILE]     # default: every workload once; markdown to stdout"""
from __future__ import annotations
import argparse, html, json, os, re, subprocess, sys, time
from pathlib import Path
from .common import ROOT, machine_info, machine_md, md_table

SCENARIOS = ('input', 'compute', 'optimizer', 'metric', 'callback', 'tabular')
OWN = ('tab_metric', 'embed', 'demo')
GOALS = dict(lines=12, headline=100, busy=2, fix_line=3, sentence=160, html=900)
MARK = '@@verdict '

# ---------------------------------------------------------------- the workloads (in the child)

def _sleepy(item_sleep=0., fwd_sleep=.001, step_sleep=0., cbs=None, metrics=None, n_train=24, n_valid=8, bs=8, workers=0):
    "The test suite's scenario learner: `y = a x + b` whose items, forward (per sample), optimizer step or callbacks sleep"
    import torch
    from torch import nn
    from fastai.basics import Learner, DataLoaders, Module, MSELossFlat, SGD, Callback
    from fastai.data.core import TfmdDL
    class DS(torch.utils.data.Dataset):
        def __init__(self, n): self.x = torch.randn(n, 1); self.y = 2*self.x + 3
        def __len__(self): return len(self.x)
        def __getitem__(self, i):
            if item_sleep: time.sleep(item_sleep)
            return self.x[i], self.y[i]
    class M(Module):
        def __init__(self): self.a,self.b = nn.Parameter(torch.randn(1)),nn.Parameter(torch.randn(1))
        def forward(self, x):
            if fwd_sleep: time.sleep(fwd_sleep*len(x)/8)
            return x*self.a + self.b
    def opt(params, lr, **kw):
        o = SGD(params, lr, **kw)
        if step_sleep:
            step = o.step
            def slow(*a, **k): time.sleep(step_sleep); return step(*a, **k)
            o.step = slow
        return o
    dls = DataLoaders(TfmdDL(DS(n_train*bs), bs=bs, shuffle=True, num_workers=workers), TfmdDL(DS(n_valid*bs), bs=bs, num_workers=workers))
    return Learner(dls, M(), loss_func=MSELossFlat(), opt_func=opt, lr=1e-2, cbs=cbs, metrics=metrics)

def _slow_metric(s):
    def slow_mae(inp, targ): time.sleep(s); return (inp - targ).abs().mean()
    return slow_mae

def _sleepy_callback(s):
    from fastai.basics import Callback
    class SleepyCallback(Callback):
        def after_batch(self): time.sleep(s)
    return SleepyCallback()

def _embed(bs=32, n=4096, vocab=2000, length=48, workers=2):
    "An embedding-bag classifier on `n` synthetic sequences of token ids (2 classes), its loader in `workers` processes"
    import torch
    from torch import nn
    from fastai.basics import Learner, DataLoaders, CrossEntropyLossFlat, accuracy
    g = torch.Generator().manual_seed(0)
    x,y = torch.randint(0, vocab, (n, length), generator=g),torch.randint(0, 2, (n,), generator=g)
    class Bag(nn.Module):
        def __init__(self): super().__init__(); self.emb,self.head = nn.EmbeddingBag(vocab, 64),nn.Linear(64, 2)
        def forward(self, x): return self.head(torch.relu(self.emb(x)))
    items = list(zip(x, y))
    dls = DataLoaders.from_dsets(items[:-n//5], items[-n//5:], bs=bs, num_workers=workers, shuffle=True)
    return Learner(dls, Bag(), loss_func=CrossEntropyLossFlat(), metrics=accuracy)

def workload(name:str):
    "The learner of workload `name`, ready to fit (progress bar off)"
    from fastai.callback.progress import ProgressCallback
    if name == 'input': learn = _sleepy(item_sleep=.002)
    elif name == 'compute': learn = _sleepy(fwd_sleep=.008)
    elif name == 'optimizer': learn = _sleepy(step_sleep=.008)
    elif name == 'metric': learn = _sleepy(fwd_sleep=.004, metrics=_slow_metric(.015), n_valid=32, n_train=12)
    elif name == 'callback': learn = _sleepy(fwd_sleep=.006, cbs=_sleepy_callback(.008), n_train=12)
    elif name in ('tabular', 'tab_metric'):
        from .batch import tabular
        learn = tabular(64, 20000)  # the 20,000 rows: a fit long enough to time larger batches within 3% of it
        if name == 'tab_metric': learn.metrics = list(learn.metrics) + [_slow_metric(.01)]
    elif name == 'embed': learn = _embed()
    elif name == 'demo':
        from fastprofile.demo import make_demo_learner
        learn = make_demo_learner()
    else: raise ValueError(f"unknown workload {name!r}: valid are {', '.join(SCENARIOS + OWN)}")
    if ProgressCallback in [type(c) for c in learn.cbs]: learn.remove_cb(ProgressCallback)
    return learn

def child(names:list):
    "Fit each workload with the report shown (into this process's stdout: a pipe), then a line of what the diagnosis holds"
    import warnings; warnings.simplefilter('ignore')
    import fastprofile.all  # noqa: F401 (`learn.profile`)
    for name in names:
        learn = workload(name)
        print(f"{MARK}start {name}", flush=True)
        learn.profile(logger_callback=None).fit(1)
        res = learn.simple_profile
        d = res.section('Diagnosis')
        h = res.report._repr_html_()
        sec = re.search(r'<div class="fp-section"><div class="fp-title">Diagnosis</div>(.*?)</div>(?=<div class="fp-section">|</div>$)', h, re.S)
        out = '' if sec is None else re.sub(r'<details.*?</details>', '', sec.group(1), flags=re.S)
        text = html.unescape(re.sub(r'<[^>]+>', '', out))
        print(MARK + json.dumps(dict(name=name, verdict=d.verdict, knob=d.knob, change=d.change, speedup=d.predicted_speedup,
                                     kind=d.speedup_kind, lines=d.lines(), html_chars=len(text), busy=bool(d.machine),
                                     lead=[f.say for f in d.lead])), flush=True)

# ---------------------------------------------------------------- reading what was printed (in this process)

def section(text:str) -> list:
    "The printed *Diagnosis* section: its title line and the lines under it (as wrapped), up to the next blank line"
    ls = text.splitlines()
    i = next(k for k,l in enumerate(ls) if l.rstrip() == 'Diagnosis:')
    out = [ls[i]]
    for l in ls[i+1:]:
        if not l.strip() or not l.startswith('  '): break
        out.append(l)
    return out

def check(printed:list, facts:dict) -> dict:
    "The goals' figures for one workload, from its printed section and the diagnosis' own lines"
    body = [l.strip() for l in printed[1:]]
    busy = 0
    if body and body[0].startswith('Busy machine'):
        busy = next((k for k,l in enumerate(body) if l.startswith('Bound by')), len(body))
    rest = body[busy:]
    head = rest[0] if rest else ''
    code = next((k for k,l in enumerate(rest) if '`' in l), None)  # the line (0: the headline) of the first code span
    speed = re.compile(r'\d+\.\d+x predicted|at most \d+\.\d+x')
    fix_at = next((k for k,l in enumerate(rest) if l.startswith(('Fix:', 'Fix ('))), None)
    has_speed = fix_at is not None and any(speed.search(l) for l in rest[fix_at:fix_at+2])
    sentences = [s for l in facts['lines'] for s in re.split(r'(?<=[.!?])\s+(?=[A-Z`])', l)]
    return dict(name=facts['name'], verdict=facts['verdict'], lines=len(printed), headline=len(head), busy=busy,
                code_line=code, speedup_shown=has_speed, longest=max(map(len, sentences), default=0),
                repeated=len(body) - len(set(body)), html=facts['html_chars'], share='% of the fit' in head,
                knob=facts['lead'][0] if facts['lead'] else '', speedup=facts['speedup'], kind=facts['kind'], lead=facts['lead'])

def met(r:dict) -> bool:
    "Whether workload `r`'s figures meet every goal"
    return (r['lines'] <= GOALS['lines'] and r['headline'] <= GOALS['headline'] and r['share'] and r['busy'] <= GOALS['busy']
            and (r['code_line'] is None and r['kind'] != 'model' or r['code_line'] is not None and r['code_line'] <= 1 + 2)
            and (r['speedup_shown'] or r['knob'] == '') and r['longest'] <= GOALS['sentence'] and r['repeated'] == 0
            and r['html'] <= GOALS['html'])

def measure(names, timeout:float=600) -> list:
    "Run the workloads in a child whose stdout is a pipe, 100 columns wide; the figures of each"
    env = {k:v for k,v in os.environ.items() if k not in ('FORCE_COLOR', 'TERM', 'COLORTERM')}
    env.update(COLUMNS='100', PYTHONPATH=str(ROOT) + os.pathsep + env.get('PYTHONPATH', ''), FASTPROFILE_STRICT='1')
    r = subprocess.run([sys.executable, '-m', 'bench.verdict', '--child', *names], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=timeout)
    if r.returncode: raise RuntimeError(f"the verdict child failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    out,parts = [],r.stdout.split(f"{MARK}start ")[1:]
    for p in parts:
        report,_,rest = p.partition(MARK + '{')
        facts = json.loads('{' + rest.splitlines()[0])
        out.append(dict(check(section(report), facts), printed=section(report)))
    return out

def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench verdict', description=__doc__.split('\n')[0])
    ap.add_argument('names', nargs='*', help=f"workloads (default: all): {', '.join(SCENARIOS + OWN)}")
    ap.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    ap.add_argument('--json', help='also write the figures and the printed sections here')
    ap.add_argument('--runs', type=int, default=1, help='run every workload this many times (fresh processes): the first fix of each run')
    a = ap.parse_args(argv)
    names = a.names or list(SCENARIOS + OWN)
    if a.child: return child(names)
    t0 = time.time()
    runs = [measure(names, timeout=1800) for _ in range(max(a.runs, 1))]
    rs = runs[0]
    print(f"## The verdict as printed into a pipe, 100 columns\n\n{machine_md(machine_info())} Run time {time.time() - t0:.0f} s. "
          f"Command: `python -m bench verdict{' ' + ' '.join(a.names) if a.names else ''}`.\n")
    rows = [[r['name'], r['verdict'], str(r['lines']), str(r['headline']), str(r['busy']),
             '-' if r['code_line'] is None else str(r['code_line'] + 1), str(r['longest']), str(r['html']),
             f"{r['knob']}: {r['speedup']:.2f}x {'predicted' if r['kind'] == 'model' else 'at most'}" if r['knob'] else '-',
             'yes' if met(r) else 'no'] for r in rs]
    print(md_table(['workload', 'verdict', 'lines (≤ 12)', 'headline (≤ 100)', 'busy lines', 'first code on line (≤ 3)',
                    'longest sentence (≤ 160)', 'HTML chars (≤ 900)', 'first fix', 'goals met'], rows))
    if len(runs) > 1:  # the first fix of each run: the same in every run, or not
        print(f"\nThe first fix in each of {len(runs)} runs (its first code span, its speedup, what it ties with):\n")
        first = lambda say: (re.findall(r'`[^`]+`', say) or [say or '-'])[0]
        code = lambda r: first(r['lead'][0]) if r['lead'] else '-'  # the first fix said (of a tie: the first of it)
        ties = lambda r: f" (a tie with {', '.join(map(first, r['lead'][1:]))})" if len(r['lead']) > 1 else ''
        rows = []
        for n in names:
            got = [next(x for x in run if x['name'] == n) for run in runs]
            leads = [code(r) for r in got]
            rows.append([n, *(f"{code(r)}: {r['speedup']:.2f}x{ties(r)}" for r in got), f"{max(map(leads.count, leads))} of {len(runs)}"])
        print(md_table(['workload', *(f'run {i+1}' for i in range(len(runs))), 'same first fix'], rows))
    for r in rs: print(f"\n`{r['name']}`:\n```\n" + '\n'.join(r['printed']) + "\n```")
    if a.json: Path(a.json).write_text(json.dumps(rs, indent=1))

if __name__ == '__main__': main()
