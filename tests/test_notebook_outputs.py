"""The docs' examples: every notebook that exports a module shows one real output of what it makes.

`tools/outputs.py` runs the notebooks and keeps the outputs of the code cells tagged `keep_output` (cell metadata
`tags`), and only theirs, with a `src-` tag that hashes the source they were made from. These tests only read the
notebooks' JSON (and use `tools/outputs.py`'s hash): run `python tools/outputs.py` when one fails."""
import importlib.util, json, re, shutil
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
TAG = 'keep_output'
KINDS = {'stream', 'display_data', 'execute_result'}
MIMES = {'text/plain', 'text/html', 'text/markdown', 'image/png'}
MAX_BYTES = 150_000  # the outputs of one cell, as stored

def _src(cell) -> str: return ''.join(cell['source']) if isinstance(cell['source'], list) else cell['source']

def _exports(nb) -> bool:
    "Whether the notebook makes a module: a `#| default_exp` comment, or nbdev's metadata form of it"
    if (nb.get('metadata', {}).get('nbdev') or {}).get('default_exp'): return True
    return any(c['cell_type'] == 'code' and re.search(r'^#\|\s*default_exp\s+\S', _src(c), re.M) for c in nb['cells'])

def _tagged(cell) -> bool: return cell['cell_type'] == 'code' and TAG in (cell.get('metadata', {}).get('tags') or [])

def _tool():
    "`tools/outputs.py` as a module (it is a script, not a package)"
    spec = importlib.util.spec_from_file_location('fastprofile_tools_outputs', ROOT/'tools'/'outputs.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

OUTPUTS = _tool()

def _stale(path:Path, nb:dict) -> list:
    "A line for each tagged cell of `nb` whose outputs lack the `src-` tag of its current source"
    res = []
    for i,c in enumerate(nb['cells']):
        if not _tagged(c) or not c.get('outputs'): continue
        have,want = [t for t in c['metadata']['tags'] if OUTPUTS.SRC_TAG.fullmatch(t)], OUTPUTS.source_tag(c)
        if have == [want]: continue
        why = 'no `src-` tag: nothing says which source made its outputs' if not have else \
              f'its source changed since its outputs were made ({", ".join(have)}, now {want})'
        res.append(f"{path.name} cell {i} (id {c.get('id')}): {why}: refresh them with `python tools/outputs.py nbs/{path.name}` "
                   f"(or, if they are known to be fresh, `python tools/outputs.py --stamp nbs/{path.name}`)")
    return res

def _shown(o) -> bool:
    "Whether output `o` shows something: stdout text, or a kept MIME type with content"
    if o['output_type'] == 'stream': return bool(''.join(o.get('text', '')).strip())
    return any(''.join(v).strip() for k,v in o.get('data', {}).items() if k in MIMES)

NOTEBOOKS = sorted(NBS.glob('*.ipynb'))
EXPORTING = [p for p in NOTEBOOKS if _exports(json.loads(p.read_text(encoding='utf-8')))]

def test_the_notebooks_are_found():
    assert len(EXPORTING) >= 40, [p.name for p in EXPORTING]

@pytest.mark.parametrize('path', EXPORTING, ids=lambda p: p.name)
def test_each_module_shows_an_output(path):
    nb = json.loads(path.read_text(encoding='utf-8'))
    cells = [c for c in nb['cells'] if _tagged(c)]
    assert cells, f"{path.name}: no code cell tagged `{TAG}` (tag the cell that shows what the module makes)"
    assert any(any(_shown(o) for o in c.get('outputs', [])) for c in cells), \
        f"{path.name}: its `{TAG}` cell has no output: run `python tools/outputs.py {path.name}`"

@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_only_tagged_cells_keep_outputs(path):
    "Outputs are made by `tools/outputs.py`: only in tagged cells, no errors, kept MIME types, modest in size"
    nb = json.loads(path.read_text(encoding='utf-8'))
    for i,c in enumerate(nb['cells']):
        if c['cell_type'] != 'code': continue
        outs = c.get('outputs', [])
        if not _tagged(c):
            assert not outs, f"{path.name} cell {i}: outputs in a cell not tagged `{TAG}` (`python tools/outputs.py {path.name}` clears them)"
            continue
        for o in outs:
            assert o['output_type'] in KINDS, f"{path.name} cell {i}: a {o['output_type']} output"
            assert o['output_type'] != 'stream' or o['name'] == 'stdout', f"{path.name} cell {i}: {o['name']} kept"
            assert set(o.get('data', {})) <= MIMES, f"{path.name} cell {i}: {sorted(set(o['data']) - MIMES)}"
        size = len(json.dumps(outs, ensure_ascii=False).encode())
        assert size <= MAX_BYTES, f"{path.name} cell {i}: {size:,} bytes of outputs (at most {MAX_BYTES:,}): show something smaller"

@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_match_their_source(path):
    "A tagged cell's outputs carry the hash of the source that made them: an edited cell's old outputs fail here"
    stale = _stale(path, json.loads(path.read_text(encoding='utf-8')))
    assert not stale, '\n'.join(stale)

def test_stamp_tags_the_current_source_and_changes_nothing_else(tmp_path):
    "`--stamp` runs nothing, writes only the `src-` tags; editing a tagged cell's source makes its outputs stale"
    path = tmp_path/'guide_start.ipynb'
    shutil.copy(NBS/path.name, path)
    before = json.loads(path.read_text(encoding='utf-8'))
    kept = [i for i,c in enumerate(before['cells']) if _tagged(c) and c['outputs']]
    assert len(kept) >= 2, kept
    for c in before['cells']: OUTPUTS.set_source_tag(c, False)
    path.write_text(OUTPUTS.dumps(before), encoding='utf-8')
    assert len(_stale(path, before)) == len(kept)  # outputs without a tag are not trusted
    assert OUTPUTS.main(['--stamp', str(path)]) == 0
    after = json.loads(path.read_text(encoding='utf-8'))
    assert not _stale(path, after)
    for i,c in enumerate(after['cells']):
        tags = c.get('metadata', {}).get('tags')
        assert tags == ([TAG, OUTPUTS.source_tag(c)] if i in kept else before['cells'][i]['metadata'].get('tags')), (i, tags)
        c['metadata'].pop('tags', None); before['cells'][i]['metadata'].pop('tags', None)
    assert after == before  # nothing else changed: sources, outputs, ids, notebook metadata
    after,i = json.loads(path.read_text(encoding='utf-8')),kept[0]
    after['cells'][i]['source'][-1] += ' '  # an edit that would leave the old outputs in place
    path.write_text(OUTPUTS.dumps(after), encoding='utf-8')
    stale = _stale(path, after)
    assert len(stale) == 1 and f'cell {i} ' in stale[0] and 'source changed' in stale[0], stale
    assert f'python tools/outputs.py nbs/{path.name}' in stale[0]
    assert OUTPUTS.main(['--stamp', str(path)]) == 0
    assert not _stale(path, json.loads(path.read_text(encoding='utf-8')))
