#!/usr/bin/env python
"""Run the notebooks in `nbs/` and keep the outputs of the cells tagged `keep_output`: the docs' examples.

    python tools/outputs.py [NOTEBOOK...]          # default: every notebook in nbs/
    python tools/outputs.py --stamp [NOTEBOOK...]  # only stamp the tagged cells' outputs as made by their source

Each notebook runs in a fresh `python3` kernel (the interpreter running this script), in `nbs/`, with
`FASTPROFILE_STRICT=1`, `MPLBACKEND=Agg`, the repository first on `PYTHONPATH` (the kernel must import this
checkout's `fastprofile`: checked before any cell runs) and `%matplotlib inline` (a figure is stored as a PNG, at
80 dpi: a few tens of kB).
Cells that `nbdev-test` skips are skipped (the `tst_flags` of pyproject.toml: `#| notest`, `#| slow`, `#| cuda`;
`#| eval: false`; nbdev's own rules, through `nbdev.test.nb_test_cells`), and cells after the last tagged one
are not run (their outputs are not kept; `--all-cells` runs them too).

A code cell keeps its outputs only if its metadata has the tag `keep_output` (`"tags": ["keep_output"]`);
every other code cell's outputs are cleared. Outputs are written as `nbdev-clean` leaves them: execution
counts None, no output metadata, no `at 0x...` in reprs, and only `text/plain`, `text/html`, `text/markdown`
and `image/png` (and stdout; stderr is dropped, with a note). The notebook is written back in the project's
format (`json.dumps(nb, indent=1, ensure_ascii=False)+"\\n"`) unless it changed on disk meanwhile.

Failing loudly: a tagged cell that errors or times out, that nbdev would skip or that shows nothing, a kernel that
dies: the notebook is left as it was, the error is printed, and the script exits with status 1. An untagged cell
that errors is a WARNING (its outputs are cleared anyway) and the cells after it run on: a Jupyter kernel is not
`nbdev-test`'s shell (fastprogress draws HTML bars, rich renders to the notebook), so a check written for the
latter can fail here; `--strict` makes that fail the notebook too.

Each kept cell also gets a second tag, `src-` and 8 hex digits of the sha256 of its source text (`"tags":
["keep_output", "src-1a2b3c4d"]`): the source its outputs were made from. `tests/test_notebook_outputs.py` fails for
a cell whose source no longer matches, so an edited cell's old outputs cannot pass as its own; other cells lose the tag.
`--stamp` runs nothing: it (re)writes the `src-` tag of every tagged cell that has outputs from its current source
(and takes it off the others), for outputs known to be fresh (the edit changed no output: a comment, a rename).

The tags travel with their cell (pyproject.toml's `allowed_cell_metadata_keys` keeps them through `nbdev-clean`): run
this again whenever a tagged cell changes; outputs and tags never change what `nbdev-export` writes.
"""
import argparse, copy, hashlib, json, os, re, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
TAG = 'keep_output'
SRC_TAG = re.compile(r'src-[0-9a-f]{8}')  # the tag with the hash of the source that made a kept cell's outputs
KEEP_MIMES = ('text/plain', 'text/html', 'text/markdown', 'image/png')
BIG = 100_000  # bytes of outputs in one cell above which a warning is printed

SETUP = f"""
%matplotlib inline
%config InlineBackend.print_figure_kwargs = {{'bbox_inches': 'tight', 'dpi': 80}}
import importlib.util as _iu, pathlib as _pl, sys as _sys
_spec = _iu.find_spec('fastprofile')
assert _spec is not None and _pl.Path(_spec.origin).resolve().is_relative_to(_pl.Path({str(ROOT)!r})), \\
    f"the kernel imports fastprofile from {{_spec and _spec.origin}}, not from {str(ROOT)!r} ({{_sys.executable}})"
del _iu, _pl, _sys, _spec
"""

class NotebookFailed(Exception): pass

def tagged(cell) -> bool: return cell.get('cell_type') == 'code' and TAG in (cell.get('metadata', {}).get('tags') or [])

def dumps(nb) -> str: return json.dumps(nb, indent=1, ensure_ascii=False) + '\n'

def source_tag(cell) -> str:
    "The `src-` tag of `cell`'s current source: 8 hex digits of the sha256 of its text"
    src = cell.get('source', '')
    return 'src-' + hashlib.sha256((''.join(src) if isinstance(src, list) else src).encode('utf-8')).hexdigest()[:8]

def set_source_tag(cell, stamp:bool) -> None:
    "Give `cell` the `src-` tag of its current source (`stamp`) or take any off; its other tags stay as they were"
    md = cell.setdefault('metadata', {})
    old = md.get('tags') or []
    new = [t for t in old if not SRC_TAG.fullmatch(t)] + ([source_tag(cell)] if stamp else [])
    if new == old: return
    if new: md['tags'] = new
    else: md.pop('tags', None)

def write(path:Path, text:str) -> None:
    "Write `text` to `path` through a temporary file in its folder, keeping its mode"
    tmp = path.with_name(f'.{path.name}.tmp')
    tmp.write_text(text, encoding='utf-8'); os.chmod(tmp, path.stat().st_mode & 0o777); os.replace(tmp, path)

def nbdev_cells(path:Path) -> set:
    "Indices of the cells `nbdev-test` would run in the notebook at `path`"
    from nbdev.config import get_config
    from nbdev.test import nb_test_cells
    flags = get_config(ROOT).tst_flags
    if isinstance(flags, str): flags = flags.split()
    return {c.idx_ for c in nb_test_cells(path, flags)}

_ID = re.compile(r'(<.*?)( at 0x[0-9a-fA-F]+)(>)')  # as nbdev-clean

def _lines(s:str) -> list: return s.splitlines(True)

def clean_outputs(outputs, notes:list) -> list:
    "`outputs` as nbdev-clean leaves them, with only the kept MIME types and stdout; consecutive stdout chunks joined"
    res = []
    for o in outputs:
        kind = o['output_type']
        if kind == 'stream':
            if o['name'] != 'stdout':
                notes.append(f"dropped {o['name']}: {o['text'].strip()[:200]!r}"); continue
            text = _ID.sub(r'\1\3', o['text'])
            if res and res[-1]['output_type'] == 'stream': res[-1]['text'] += text
            else: res.append(dict(name='stdout', output_type='stream', text=text))
        elif kind in ('display_data', 'execute_result'):
            data = {}
            for k,v in o.get('data', {}).items():
                if k not in KEEP_MIMES: continue
                if isinstance(v, list): v = ''.join(v)
                data[k] = v.rstrip() if k.startswith('image/') else _ID.sub(r'\1\3', v)
            if not any(v.strip() for v in data.values()): continue  # nothing a reader would see (a progress bar taken down)
            out = dict(data=dict(sorted(data.items())), metadata={}, output_type=kind)
            if kind == 'execute_result': out['execution_count'] = None
            res.append(out)
        elif kind == 'error': raise NotebookFailed(f"error output: {o.get('ename')}: {o.get('evalue')}")
    for o in res:  # the notebook's own format: text split into lines, keys sorted (as nbformat writes them)
        if 'text' in o: o['text'] = _lines(o['text'])
        for k,v in o.get('data', {}).items():
            if k.startswith('text/'): o['data'][k] = _lines(v)
    return [dict(sorted(o.items())) for o in res]

def run_notebook(path:Path, timeout:int, all_cells:bool=False, strict:bool=False) -> dict:
    "Run the notebook at `path` and write back its tagged cells' outputs; what happened, for the summary"
    import nbformat
    from nbclient import NotebookClient
    text = path.read_text(encoding='utf-8')
    raw = json.loads(text)
    cells = raw['cells']
    keep = [i for i,c in enumerate(cells) if tagged(c)]
    info = dict(name=path.name, kept=keep, ran=0, seconds=0., notes=[], errors=[])
    outputs = {}
    if keep:
        runs = nbdev_cells(path)
        if skipped := [i for i in keep if i not in runs]:
            raise NotebookFailed(f"cell(s) {skipped} tagged `{TAG}` but skipped by nbdev-test (notest/slow/cuda/eval: false)")
        last = len(cells) if all_cells else max(keep)
        todo = sorted(i for i in runs if i <= last)
        nb = nbformat.from_dict(copy.deepcopy(raw))
        for c in nb.cells:  # cells without an id (nbformat 4.5 wants one) run as well
            if c.cell_type == 'code' and isinstance(c.source, list): c.source = ''.join(c.source)
        client = NotebookClient(nb, timeout=timeout, kernel_name='python3', allow_errors=False, force_raise_errors=True,
                                record_timing=False, resources={'metadata': {'path': str(NBS)}})
        t0 = time.perf_counter()
        with tempfile.TemporaryFile('w+') as klog:  # the kernel process's own messages, shown if it dies
            with client.setup_kernel(stderr=klog):
                try: outputs = _run_cells(client, nb, todo, keep, strict, info)
                except NotebookFailed as e:
                    if 'Kernel died' in str(e):
                        klog.seek(0); e.args = (f"{e}\nthe kernel's own messages (last 20 lines):\n" + '\n'.join(klog.read().splitlines()[-20:]),)
                    raise
        info['seconds'] = time.perf_counter() - t0
    for i,c in enumerate(cells):
        if c.get('cell_type') != 'code': continue
        c['outputs'] = outputs.get(i, [])
        c['execution_count'] = None
        c.get('metadata', {}).pop('execution', None)
        set_source_tag(c, i in outputs)
    new = dumps(raw)
    if path.read_text(encoding='utf-8') != text: raise NotebookFailed("changed on disk while it ran: not written (run it again)")
    info['changed'] = new != text
    if info['changed']: write(path, new)
    return info

def stamp_notebook(path:Path) -> dict:
    "Set the `src-` tags of the notebook at `path` from the cells' current source, running nothing; what was done"
    text = path.read_text(encoding='utf-8')
    raw = json.loads(text)
    info = dict(name=path.name, stamped=[], empty=[])
    for i,c in enumerate(raw['cells']):
        if c.get('cell_type') != 'code': continue
        shown = tagged(c) and bool(c.get('outputs'))
        if shown: info['stamped'].append(i)
        elif tagged(c): info['empty'].append(i)
        set_source_tag(c, shown)
    new = dumps(raw)
    info['changed'] = new != text
    if info['changed']: write(path, new)
    return info

def _run_cells(client, nb, todo:list, keep:list, strict:bool, info:dict) -> dict:
    "Run the set-up, then cells `todo` of `nb` in order; the cleaned outputs of the cells in `keep`"
    import nbformat
    from nbclient.exceptions import DeadKernelError
    try: client.execute_cell(nbformat.v4.new_code_cell(SETUP), 0, store_history=False)
    except Exception as e: raise NotebookFailed(f"kernel set-up failed:\n{_tail(e)}") from None
    outputs = {}
    for i in todo:
        c = nb.cells[i]
        try: client.execute_cell(c, i)
        except Exception as e:
            what = f"cell {i} (id {c.get('id')}, {_first_line(c.source)!r}) failed"
            if i in keep or strict or isinstance(e, DeadKernelError):
                raise NotebookFailed('\n'.join([*[f"(before: {x})" for x in info['errors']], f"{what}:", _tail(e)])) from None
            info['errors'].append(f"{what} (its outputs are not kept; the cells after it ran on): {_last_line(e)}")
        info['ran'] += 1
        if i not in keep: continue
        if info['errors']: info['notes'].append(f"cell {i}'s outputs were made after a failed cell")
        notes = []
        outputs[i] = clean_outputs(c.outputs, notes)
        info['notes'] += [f"cell {i}: {n}" for n in notes]
        if not outputs[i]: raise NotebookFailed(f"cell {i} (id {c.get('id')}) is tagged `{TAG}` but shows nothing")
        size = len(json.dumps(outputs[i], ensure_ascii=False).encode())
        if size > BIG: info['notes'].append(f"cell {i}: {size:,} bytes of outputs (more than {BIG:,})")
    return outputs

def _first_line(src) -> str:
    src = ''.join(src) if isinstance(src, list) else src
    return next((l for l in src.splitlines() if l.strip() and not l.startswith('#|')), '')[:60]

def _last_line(e) -> str:
    "The exception's own line (`ValueError: ...`) from an nbclient error's text, colours taken off"
    lines = [l for l in re.sub(r'\x1b\[[0-9;]*m', '', str(e)).splitlines() if l.strip()]
    return next((l for l in reversed(lines) if re.match(r'^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b', l)), lines[-1] if lines else '')[:300]

def _tail(e, n:int=40) -> str:
    "The last `n` lines of an nbclient error's text (the cell's source and traceback), colours taken off"
    return '\n'.join(re.sub(r'\x1b\[[0-9;]*m', '', str(e)).splitlines()[-n:])

def notebooks(names) -> list:
    if not names: return sorted(p for p in NBS.glob('*.ipynb') if not p.name.startswith('_'))
    res = []
    for n in names:
        p = Path(n)
        for cand in (p, NBS/p, NBS/p.with_suffix('.ipynb'), NBS/f'{n}.ipynb'):
            if cand.suffix == '.ipynb' and cand.is_file(): res.append(cand.resolve()); break
        else: sys.exit(f"outputs: no notebook {n!r} (looked in . and {NBS})")
    return res

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('notebooks', nargs='*', help='notebooks (paths, or names in nbs/); default: all of nbs/')
    p.add_argument('--timeout', type=int, default=600, help='seconds a cell may run (default 600)')
    p.add_argument('--all-cells', action='store_true', help='also run the cells after the last tagged one')
    p.add_argument('--strict', action='store_true', help='a cell that errors fails its notebook, tagged or not')
    p.add_argument('--stamp', action='store_true',
                   help="run nothing: tag the tagged cells' outputs as made by their current source (outputs known to be fresh)")
    args = p.parse_args(argv)
    if args.stamp and (args.all_cells or args.strict): p.error('--stamp runs nothing: --all-cells and --strict do not apply')
    if args.stamp: return stamp(notebooks(args.notebooks))
    os.environ.update(FASTPROFILE_STRICT='1', MPLBACKEND='Agg', PYDEVD_DISABLE_FILE_VALIDATION='1',
                      PYTHONPATH=os.pathsep.join([str(ROOT)] + [x for x in os.environ.get('PYTHONPATH', '').split(os.pathsep) if x]))
    t0,failed,missing,errored = time.perf_counter(),[],[],[]
    for path in notebooks(args.notebooks):
        try: info = run_notebook(path, args.timeout, args.all_cells, args.strict)
        except NotebookFailed as e:
            failed.append(path.name); print(f"FAILED {path.name}: {e}", flush=True); continue
        if not info['kept']: missing.append(path.name)
        if info['errors']: errored.append(path.name)
        what = f"kept cell(s) {info['kept']}, ran {info['ran']} cells in {info['seconds']:.1f} s" if info['kept'] else 'no cell tagged: outputs cleared'
        print(f"{path.name}: {what}{'' if info['changed'] else ', unchanged'}", flush=True)
        for n in info['errors']: print(f"  WARNING: {n}", flush=True)
        for n in info['notes']: print(f"  note: {n}", flush=True)
    print(f"{time.perf_counter()-t0:.0f} s in all" + (f"; no cell tagged `{TAG}` in: {', '.join(missing)}" if missing else '')
          + (f"; untagged cells failed in: {', '.join(errored)}" if errored else ''))
    if failed: print(f"FAILED: {', '.join(failed)}", file=sys.stderr); return 1
    return 0

def stamp(paths:list) -> int:
    "Stamp the notebooks at `paths`, printing one line each"
    for path in paths:
        info = stamp_notebook(path)
        what = f"stamped cell(s) {info['stamped']}" if info['stamped'] else 'no tagged cell with outputs'
        print(f"{path.name}: {what}{'' if info['changed'] else ', unchanged'}", flush=True)
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for i in info['empty']: print(f"  note: cell {i} is tagged `{TAG}` but has no outputs: run `python tools/outputs.py {name}`")
    return 0

if __name__ == '__main__': sys.exit(main())
