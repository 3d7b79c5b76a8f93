"""fastai's own notebooks, run as `nbdev-test` runs them, once as they are and once with a first cell `import fastprofile.all`:
the README's promise that importing fastprofile (which patches `Learner.all_batches` and registers `before_draw`) changes
nothing in fastai.

Each notebook runs in its own fresh process per variant (`nbdev.test.test_nb`, execnb's `CaptureShell`, in the notebook's
folder), with a time limit; cells flagged with fastai's `tst_flags` (`slow`, `cpp`, `cuda`, `multicuda`, read from the
notebooks' `pyproject.toml`/`settings.ini` when there) are skipped, as fastai's CI does. The variant with fastprofile runs
with `FASTPROFILE_STRICT=1`, so that fastprofile's own failures raise instead of warning (`--no-strict`: as a user runs it).
Both variants run a copy of the notebook written beside it (`.fnbs-<variant>-<pid>-<name>.ipynb`, removed afterwards), so
that the one difference is the added cell. fastai and fastprofile are imported from this venv and this tree; the
notebooks' own `fastai/` package is never put on the path. No GPU, no internet, no torchvision: the notebooks that need
one (`SKIPPED`) are left out and listed.

    python -m bench.fastai_nbs --nbs DIR              # DIR holds fastai's notebooks (fastai's `nbs/`)
    python -m bench.fastai_nbs --git-dir G [--rev R]  # a bare clone of fastai (the `fetch` tool's mirror): nbs/ at R

fastai/fastai's snapshot is over the `fetch` tool's size limit; the fork kafkasl/fastai holds upstream commit ba7a7c12
(2026-05-21, version string 2.8.8), whose `fastai/` differs from the 2.8.12 wheel's learner, optimizer and callbacks only
in `Self.reset()` (2.8.12: `~Self.reset()`) and `starmap`: `--git-dir /work/.mirror/kafkasl+fastai/repo --rev ba7a7c12`.

Where a notebook passes as is and fails with fastprofile, a control runs it a third time with a first cell importing the
fastai modules that `import fastprofile.all` imports, without fastprofile (`--no-control`: none): a failure there too is
the notebook's dependence on what is imported before it, not fastprofile's patch (`13a_learner` defines `Learner` and
`Recorder` itself and assumes the installed `fastai.learner` was never imported: `defaults.callbacks` gets its `Recorder`).

`--names a,b` runs those notebooks (names without `.ipynb`), `--flags slow` runs the cells so flagged too (as nbdev-test's
`--flags`), `--timeout S` (default 300) limits each run, `--jobs N` (default 1) runs N at once, `--show` prints the tail of
every failure (a failure with fastprofile only is always shown), `--json FILE` writes the results. Prints a markdown
table; exit status 1 when a notebook passes as is and fails with fastprofile (control or not)."""
from __future__ import annotations
import argparse, json, os, re, signal, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from .common import ROOT, RESULT_TAG, machine_info, machine_md

# The learner, callback and training-loop notebooks that run on a CPU, offline, without torchvision (fastai 2.8)
DEFAULT_NBS = ('13_callback.core', '13a_learner', '14_callback.schedule', '14a_callback.data', '15_callback.hook',
               '16_callback.progress', '17_callback.tracker', '18b_callback.preds', '18c_callback.channelslast',
               '20a_distributed', '34_callback.rnn', '97_test_utils')
# Left out, and why
SKIPPED = {'13b_metrics': 'imports fastai.vision.all (torchvision)',
           '18_callback.fp16': '`skip_exec: true` in its front matter: nbdev-test runs none of it',
           '18a_callback.training': 'imports fastai.vision.all (torchvision)',
           '19_callback.mixup': 'imports fastai.vision.all; downloads PETS',
           '20_interpret': 'imports fastai.vision.all; downloads MNIST',
           '43_tabular.learner': 'downloads ADULT_SAMPLE (untar_data)',
           '45_collab': 'downloads MovieLens (untar_data)',
           '98_test_model_export': 'imports fastai.vision.all (torchvision)'}
FASTAI_TST_FLAGS = ['slow', 'cpp', 'cuda', 'multicuda']  # fastai's `tst_flags` (pyproject.toml, [tool.nbdev])
VARIANTS = ('plain', 'fastprofile')
FIRST_CELL = {'plain': '', 'fastprofile': 'import fastprofile.all'}
# The control, run where a notebook fails only with fastprofile: a first cell importing the fastai modules that
# `import fastprofile.all` imports (found in a separate process), without fastprofile: does importing fastai suffice?
CONTROL = 'fastai-imports'

# ---------------------------------------------------------------- the child: one notebook, one variant

def run_one(nb:Path, variant:str, skip_flags:list, first:str='') -> dict:
    "Run `nb` with nbdev's runner, with a first cell `first` if not empty: {'ok', 'seconds', 'skip_exec'}"
    from nbdev.test import test_nb
    from nbdev.process import NBProcessor
    from nbdev.frontmatter import nb_frontmatter
    from fastcore.nbio import read_nb, write_nb, mk_cell
    from fastcore.basics import str2bool
    book = read_nb(nb)
    if first: book.cells.insert(0, mk_cell(first))
    copy = nb.parent/f'.fnbs-{variant}-{os.getpid()}-{nb.name}'
    write_nb(book, copy)
    try:
        skip = str2bool(nb_frontmatter(NBProcessor(copy, rm_directives=False, process=True).nb).get('skip_exec', False))
        t = time.perf_counter()
        ok,_ = test_nb(copy, skip_flags=skip_flags, showerr=True, cell_timeout=None)
        return {'ok': bool(ok), 'seconds': time.perf_counter()-t, 'skip_exec': skip}
    finally: copy.unlink(missing_ok=True)

def _child(argv):
    nb,variant,flags,first = Path(argv[0]),argv[1],argv[2].split(',') if argv[2] else [],argv[3]
    res = run_one(nb, variant, flags, first)
    print(RESULT_TAG + json.dumps(res), flush=True)
    os._exit(0)  # a notebook's leftover threads or loops do not hold the process

# ---------------------------------------------------------------- the parent

def run_variant(nb:Path, variant:str, skip_flags:list, timeout:float, strict:bool=True, first:str|None=None) -> dict:
    "Run `nb` in a fresh process with the first cell `first` (default `FIRST_CELL[variant]`): {'ok', 'seconds', 'status', 'tail'}"
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    env.update(CUDA_VISIBLE_DEVICES='', WANDB_MODE='disabled')
    env.setdefault('OMP_NUM_THREADS', '1'); env.setdefault('MKL_NUM_THREADS', '1')
    if strict: env['FASTPROFILE_STRICT'] = '1'
    else: env.pop('FASTPROFILE_STRICT', None)
    first = FIRST_CELL[variant] if first is None else first
    cmd = [sys.executable, '-m', 'bench.fastai_nbs', '--child', str(nb), variant, ','.join(skip_flags), first]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try: out,err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the notebook's children go too
        out,err = p.communicate()
        return {'ok': False, 'seconds': time.perf_counter()-t, 'status': 'timeout', 'tail': err[-4000:]}
    finally: (nb.parent/f'.fnbs-{variant}-{p.pid}-{nb.name}').unlink(missing_ok=True)  # the child's copy, if it was killed
    lines = [l for l in out.splitlines() if l.startswith(RESULT_TAG)]
    if not lines:
        return {'ok': False, 'seconds': time.perf_counter()-t, 'status': f'crashed (exit {p.returncode})', 'tail': err[-4000:]}
    res = json.loads(lines[-1][len(RESULT_TAG):])
    res.update(status='not run (skip_exec)' if res.get('skip_exec') else 'pass' if res['ok'] else 'fail',
               tail='' if res['ok'] else err[-4000:])
    return res

def tst_flags(root:Path|None) -> list:
    "fastai's `tst_flags` from `root`'s pyproject.toml or settings.ini (its cells to skip), else fastai 2.8's"
    if root is not None:
        pp,ini = root/'pyproject.toml',root/'settings.ini'
        if pp.exists():
            import tomllib
            f = tomllib.loads(pp.read_text()).get('tool', {}).get('nbdev', {}).get('tst_flags')
            if f: return f.split() if isinstance(f, str) else list(f)
        if ini.exists():
            m = re.search(r'^tst_flags\s*=\s*(.*)$', ini.read_text(), re.M)
            if m: return m.group(1).replace('|', ' ').split()
    return list(FASTAI_TST_FLAGS)

def from_git(git_dir:Path, rev:str, dest:Path) -> Path:
    "Write `nbs/` and the nbdev settings of `rev` in the bare clone `git_dir` under `dest`; files absent from the clone are left out"
    git = ['git', f'--git-dir={git_dir}']
    names = subprocess.run(git + ['ls-tree', '-r', '--name-only', rev, 'nbs', 'pyproject.toml', 'settings.ini'],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    for n in names:
        r = subprocess.run(git + ['show', f'{rev}:{n}'], capture_output=True)
        if r.returncode: continue  # a large file the snapshot lacks
        (dest/n).parent.mkdir(parents=True, exist_ok=True)
        (dest/n).write_bytes(r.stdout)
    return dest/'nbs'

def fastai_imports() -> str:
    "A cell importing the fastai modules that `import fastprofile.all` imports, found in a fresh process"
    code = "import sys, fastprofile.all; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'fastai')))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ['PYTHONPATH']] if os.environ.get('PYTHONPATH') else [])))
    mods = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, env=env, check=True).stdout.split()
    return 'import ' + ', '.join(mods)

def verdict(plain:dict, fp:dict, control:dict|None=None) -> str:
    if plain.get('skip_exec'): return 'not run: `skip_exec` in its front matter'
    if plain['ok'] and fp['ok']: return 'same'
    if plain['ok'] and control is not None and not control['ok']:
        return "fails with fastprofile, and without it when fastai's modules are imported first (control)"
    if plain['ok']: return '**fails only with fastprofile**'
    if fp['ok']: return 'passes only with fastprofile'
    return "fails without fastprofile too (not fastprofile's)"

def cell(r:dict) -> str: return f"{r['status']} ({r['seconds']:.0f} s)"

def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['--child']: return _child(argv[1:])
    ap = argparse.ArgumentParser(prog='python -m bench.fastai_nbs', description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument('--nbs', type=Path, help="a folder holding fastai's notebooks")
    src.add_argument('--git-dir', type=Path, help="a (bare) git clone of fastai; its nbs/ at --rev are run")
    ap.add_argument('--rev', default='HEAD', help="with --git-dir: the commit or tag (default HEAD)")
    ap.add_argument('--names', default=None, help=f"notebooks to run, comma-separated (default: {', '.join(DEFAULT_NBS)})")
    ap.add_argument('--flags', default='', help="flags whose cells run anyway, comma-separated (as nbdev-test's --flags; e.g. slow)")
    ap.add_argument('--timeout', type=float, default=300, help="seconds per notebook and variant (default 300)")
    ap.add_argument('--jobs', type=int, default=1, help="runs at once (default 1)")
    ap.add_argument('--no-strict', action='store_true', help="without FASTPROFILE_STRICT=1 (as a user runs it)")
    ap.add_argument('--no-control', action='store_true', help="no control run where a notebook fails only with fastprofile")
    ap.add_argument('--show', action='store_true', help="print the tail of every failure")
    ap.add_argument('--json', type=Path, default=None, help="also write the results (JSON) to this file")
    a = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    names = a.names.split(',') if a.names else list(DEFAULT_NBS)
    with tempfile.TemporaryDirectory(prefix='fastai-nbs-') as tmp:
        if a.git_dir:
            rev = subprocess.run(['git', f'--git-dir={a.git_dir}', 'rev-parse', a.rev], capture_output=True, text=True,
                                 check=True).stdout.strip()
            nbs = from_git(a.git_dir, rev, Path(tmp))
            source = f"`{a.git_dir}` at {rev}"
        else: nbs,source = a.nbs.resolve(),f"`{a.nbs}`"
        forced = set(a.flags.replace(',', ' ').split())
        flags = [f for f in tst_flags(nbs.parent) if f not in forced]
        missing = [n for n in names if not (nbs/f'{n}.ipynb').exists()]
        if missing: ap.error(f"not in {nbs}: {', '.join(missing)}")
        jobs = [(n,v) for n in names for v in VARIANTS]
        t0 = time.perf_counter()
        def one(job):
            n,v = job
            r = run_variant(nbs/f'{n}.ipynb', v, flags, a.timeout, strict=not a.no_strict)
            log(f"[fastai_nbs] {n} {v}: {cell(r)}")
            return r
        with ThreadPoolExecutor(max(1, a.jobs)) as ex: res = dict(zip(jobs, ex.map(one, jobs)))
        suspects = [n for n in names if res[n,'plain']['ok'] and not res[n,'fastprofile']['ok']]
        if suspects and not a.no_control:
            first = fastai_imports()
            log(f"[fastai_nbs] control for {', '.join(suspects)}: a first cell `{first[:80]}...`")
            for n in suspects:
                res[n,CONTROL] = r = run_variant(nbs/f'{n}.ipynb', CONTROL, flags, a.timeout, strict=False, first=first)
                log(f"[fastai_nbs] {n} {CONTROL}: {cell(r)}")
    info = machine_info()
    ctl = any(k[1] == CONTROL for k in res)
    rows = [f"| `{n}` | {cell(res[n,'plain'])} | {cell(res[n,'fastprofile'])} | "
            + (f"{cell(res[n,CONTROL]) if (n,CONTROL) in res else ''} | " if ctl else '')
            + f"{verdict(res[n,'plain'], res[n,'fastprofile'], res.get((n,CONTROL)))} |" for n in names]
    cmd = 'python -m bench.fastai_nbs' + (' ' + ' '.join(argv) if argv else '')
    md = '\n'.join([
        "## fastai's own notebooks with `import fastprofile.all`", '', machine_md(info), '',
        f"Command: `{cmd}`. Notebooks: {source}; cells flagged {', '.join(flags)} skipped; each run in its own process"
        f"{'' if a.no_strict else ', FASTPROFILE_STRICT=1 with fastprofile'}. Total {time.perf_counter()-t0:.0f} s.", '',
        '| notebook | as is | with `import fastprofile.all` | ' + ("control: fastai's modules imported first, no fastprofile | " if ctl else '')
        + 'verdict |', '| --- | --- | --- | ' + ('--- | ' if ctl else '') + '--- |', *rows, '',
        'Not run: ' + '; '.join(f'`{k}` ({v})' for k,v in SKIPPED.items()) + '.'])
    print(md)
    for (n,v),r in res.items():
        if not r['ok'] and (a.show or (v != 'plain' and res[n,'plain']['ok'])):
            print(f"\n### {n}, {v}: {r['status']}\n```\n{r['tail'].strip()[-3000:]}\n```")
    if a.json: a.json.write_text(json.dumps({'machine': info, 'source': source, 'flags': flags,
                                             'results': [{'notebook': n, 'variant': v, **r} for (n,v),r in res.items()]}, indent=1))
    return 1 if any(res[n,'plain']['ok'] and not res[n,'fastprofile']['ok'] for n in names) else 0  # the control excuses nothing

if __name__ == '__main__': sys.exit(main())
