"""The docs' examples: every notebook that exports a module shows one real output of what it makes.

`tools/outputs.py` runs the notebooks and keeps the outputs of the code cells tagged `keep_output` (cell metadata
`tags`), and only theirs. These tests only read the notebooks' JSON: run `python tools/outputs.py` when one fails."""
import json, re
from pathlib import Path
import pytest

NBS = Path(__file__).resolve().parent.parent/'nbs'
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
