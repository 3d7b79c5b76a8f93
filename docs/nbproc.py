"""The notebooks in `nbs/` as the docs site shows them: what nbdev's processors do before Quarto renders, for MkDocs.

`process(path)` returns a notebook (JSON) that `mkdocs-jupyter` renders as it is (nothing is run):

- directive lines (`#| ...`) are taken off; `#| default_exp`, `#| hide`, `#| exporti` and `#| include: false` cells are
  left out;
- an `#| export` cell is left out and each public function and class it defines (a `@patch`ed method as
  `Class.method`) is shown as its API entry, unless the notebook shows it with `show_doc` itself (nbdev's
  `add_show_docs`); an `#| exports` cell shows its source after the entries;
- a `show_doc(...)` cell becomes the entry it asks for: a heading, the signature, the docstring and a table of the
  parameters from their docments (`nbdev.showdoc.show_doc` with a renderer that adds `DocmentTbl`);
- a test cell, a code cell made only of `test_*(...)` calls and `assert`s (also inside `with`, `for` and `if`), is left
  out; a cell that shows an example and then asserts stays;
- stored outputs are kept as they are (ANSI colours taken off); `docs/img/` links are made `img/` links;
- a page opens with what a user calls: a notebook's `#| docs_first: Learner.profile Learner.simple_profile*` (a
  `#| hide` cell) moves those entries up, in that order, right after its introduction; the rest keeps the notebook's order;
- types are shown as a reader writes them (`str | Path`, not `'str | Path'` or `ForwardRef('str')`; a default's
  public class, not `_Default`), in the signature and in the parameter table (`ParamTable`);
- a prose cell ending in a colon whose cell the site leaves out (a test, a private export) ends in a full stop.

Symbols are looked up in the module the notebook exports (`#| default_exp`), then in `fastprofile.all` and
`fastai.basics`: build the docs with this checkout installed (`pip install -e ".[dev]"`). A `show_doc` that cannot
be rendered fails the build (`DocError`); an export cell's symbol that cannot be is left out, with a note."""
import ast, fnmatch, importlib, inspect, json, re, typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO_URL = 'https://github.com/fastprofile/fastprofile'
HIDE = {'default_exp', 'hide', 'exporti'}  # directives whose cells are never shown
_ANSI = re.compile(r'\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])')

class DocError(Exception): pass

def src(cell) -> str: return ''.join(cell['source']) if isinstance(cell['source'], list) else cell['source']

def directives(source:str):
    "The `#|` directives at the top of a code cell as a dict (`{'export': '', 'eval': 'false'}`), and the rest"
    lines, d, n = source.splitlines(), {}, 0
    while n < len(lines) and lines[n].startswith('#|'):
        k, _, v = lines[n][2:].strip().partition(' ')
        if k: d[k.rstrip(':')] = v.strip()
        n += 1
    return d, '\n'.join(lines[n:]).strip('\n')

def default_exp(nb) -> str|None:
    for c in nb['cells']:
        if c['cell_type'] == 'code' and 'default_exp' in (d := directives(src(c))[0]): return d['default_exp']

# ---- test cells

def _is_test_stmt(node) -> bool:
    "An `assert`, a `test_*(...)` call, a value put in a `_name` (a test's scratch), or a `with`/`for`/`if` of those"
    if isinstance(node, ast.Assert): return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        return bool(names) and all(n.id.startswith('_') for n in names)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        f = node.value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''
        return name.startswith('test_')
    if isinstance(node, (ast.With, ast.For, ast.If)):
        body = node.body + getattr(node, 'orelse', [])
        return bool(body) and all(map(_is_test_stmt, body))
    return False

def is_test_cell(code:str) -> bool:
    "Whether `code` only checks (`test_eq`, `test_fail`, `assert`, ...): nbdev-test runs it, the docs leave it out"
    try: tree = ast.parse(code)
    except SyntaxError: return False  # IPython magics, shell lines: shown as written
    return any(not isinstance(n, (ast.Assign, ast.AnnAssign)) for n in tree.body) and all(map(_is_test_stmt, tree.body))

# ---- API entries

def _defined(code:str) -> list:
    "Public functions and classes defined at the top of `code`, `@patch`ed methods as `Class.name` (nbdev's names; none of a private class)"
    try: tree = ast.parse(code)
    except SyntaxError: return []
    from nbdev.showdoc import showdoc_nm
    names = []
    for o in tree.body:
        if not isinstance(o, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or o.name.startswith('_'): continue
        nm = showdoc_nm(o)
        names += [n for n in (nm if isinstance(nm, list) else [nm]) if not any(part.startswith('_') for part in n.split('.'))]
    return names

_QUAL = re.compile(r'\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Za-z_])')  # `fastprofile.engine.core.Facts` -> `Facts`

_FWD = re.compile(r"ForwardRef\((['\"])(.*?)\1(?:, module=[^)]*)?\)")  # `ForwardRef('str')` -> `str`

def _anno(a) -> str:
    "An annotation as a reader writes it: `str | Path`, never `'str | Path'` (`from __future__ import annotations`) or `ForwardRef('str')`"
    if isinstance(a, str): return _QUAL.sub('', a)
    if isinstance(a, typing.ForwardRef): return _QUAL.sub('', a.__forward_arg__)
    if isinstance(a, type): return a.__qualname__
    return _QUAL.sub('', _FWD.sub(r'\2', inspect.formatannotation(a)))

def _public_type(o) -> str:
    "The type of a default value, as a reader would annotate it: its first public class (`_Default(str)` -> `str`)"
    return next((c.__qualname__ for c in type(o).__mro__ if not c.__name__.startswith('_')), type(o).__qualname__)

def signature(nm:str, sig) -> str:
    "`nm(params) -> returns`, a parameter a line when it does not fit in 70 characters (the page's code width)"
    ps = [p for p in sig.parameters.values()]
    if ps and ps[0].name in ('self', 'cls') and '.' in nm: ps = ps[1:]
    def one(p):
        s = {p.VAR_POSITIONAL: '*', p.VAR_KEYWORD: '**'}.get(p.kind, '') + p.name
        if p.annotation is not p.empty: s += f': {_anno(p.annotation)}'
        if p.default is not p.empty: s += f"{' = ' if p.annotation is not p.empty else '='}{p.default!r}"
        return s
    args = [one(p) for p in ps]
    if any(p.kind == p.KEYWORD_ONLY for p in ps) and not any(p.kind == p.VAR_POSITIONAL for p in ps):
        args.insert(next(i for i,p in enumerate(ps) if p.kind == p.KEYWORD_ONLY), '*')
    ret = '' if sig.return_annotation is sig.empty else f' -> {_anno(sig.return_annotation)}'
    flat = f"{nm}({', '.join(args)}){ret}"
    return flat if len(flat) <= 70 else f"{nm}(\n" + ''.join(f'    {a},\n' for a in args) + f"){ret}"

def source_url(sym) -> str|None:
    "Where `sym` is written: its line in the repository's generated module"
    obj = getattr(sym, 'fget', sym)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    try: path, line = Path(inspect.getsourcefile(obj)).resolve(), inspect.getsourcelines(obj)[1]
    except (TypeError, OSError): return None
    try: rel = path.relative_to(ROOT)
    except ValueError: return None
    return f'{REPO_URL}/blob/main/{rel.as_posix()}#L{line}'

def _comment_of(src_lines, name) -> str|None:
    "The comment on the line that declares parameter `name` in a function's source (`**kwargs # ...`), if any"
    for l in src_lines:
        if m := re.match(rf'\s*(?:def \w+\()?\**{name}\b[^#\n]*#\s*(.+?)\s*$', l): return m[1]

def ParamTable(sym):
    """fastcore's `DocmentTbl` of `sym`, its cells as a reader writes them: types unquoted (`str | Path`), a default's type its
    public class (`str`, not `_Default`), defaults as in the signature (`'wandb'`), `*args`/`**kwargs` starred, and the comment
    on a `**kwargs` line given to `kwargs` (fastcore gives it to the return value)"""
    from fastcore.docments import DocmentTbl
    tbl = DocmentTbl(sym)
    empty = inspect.Parameter.empty
    try: params = inspect.signature(sym).parameters
    except (TypeError, ValueError): params = {}
    ret = tbl.dm.get('return', {})
    if ret.get('docment') not in (None, empty):
        try: lines = inspect.getsource(getattr(sym, '__func__', sym)).splitlines()
        except (TypeError, OSError): lines = []
        for nm, d in tbl.dm.items():
            if nm != 'return' and d.get('docment') in (None, empty) and _comment_of(lines, nm) == ret['docment']:
                d['docment'], ret['docment'] = ret['docment'], empty
    dm = {}
    for nm, d in tbl.dm.items():
        d = dict(d)
        p = params.get(nm)
        if d.get('anno', empty) is not empty:
            d['anno'] = (_public_type(d['default']) if p is not None and p.annotation is empty and d.get('default', empty) is not empty
                         else _anno(d['anno']))
        if d.get('default', empty) is not empty: d['default'] = repr(d['default'])
        if isinstance(d.get('docment'), str): d['docment'] = ' '.join(d['docment'].split())  # a comment over lines: one text
        if p is not None and p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD): nm = ('\\*' if p.kind == p.VAR_POSITIONAL else '\\*\\*') + nm
        dm[nm] = d
    tbl.dm, tbl.params = dm, [k for k in dm if k != 'return']
    return tbl

def _renderer(prop:bool=False):
    "A `show_doc` renderer class (`prop`: the symbol is a property, shown without a call's parentheses)"
    from fastcore.docments import ShowDocRenderer
    class Renderer(ShowDocRenderer):
        "nbdev's `show_doc`, as markdown: heading, signature, docstring, then the parameters' table from their docments"
        def _repr_markdown_(self):
            sym = getattr(self.sym, 'fget', self.sym)
            out = [f"{'#'*self.title_level} {self.nm}"]
            if url := source_url(self.sym): out.append(f'<a class="fp-source" href="{url}">source</a>')
            sig = self.sig
            if sig is None:
                try: sig = inspect.signature(sym)
                except (TypeError, ValueError): sig = None
            if prop:
                ret = '' if sig is None or sig.return_annotation is sig.empty else f' -> {_anno(sig.return_annotation)}'
                out.append(f"```python\n{self.nm}{ret}  # a property\n```")
            elif sig is not None: out.append(f"```python\n{signature(self.nm, sig)}\n```")
            if self.docs: out.append(self.docs)
            try: tbl = '' if prop else ParamTable(sym)._repr_markdown_()
            except Exception: tbl = ''
            if tbl: out.append(tbl)
            return '\n\n'.join(out)
    return Renderer

def namespace(mod:str|None) -> dict:
    "The names a notebook's `show_doc` cells can use: its module's, then `fastprofile.all`'s and `fastai.basics`'"
    ns = {}
    for m in ('fastai.basics', 'fastprofile.all') + ((f'fastprofile.{mod}',) if mod else ()):
        ns.update(vars(importlib.import_module(m)))
    return ns

def render(sym, name=None, title_level:int=3) -> str:
    "The API entry of `sym` in markdown (nbdev's `show_doc` with this site's renderer)"
    from nbdev.showdoc import show_doc
    r = show_doc(sym, renderer=_renderer(isinstance(sym, property)), name=name, title_level=title_level)
    if r is None: raise DocError(f'show_doc gives nothing for {sym!r}')
    return r._repr_markdown_()

def show_doc_cells(code:str, ns:dict) -> list:
    "The entries the `show_doc(...)` calls of a cell ask for (each evaluated in `ns`)"
    out = []
    def show_doc(sym, name=None, title_level=3, **_): out.append(render(sym, name, title_level))
    for node in ast.parse(code).body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)): continue
        expr = ast.get_source_segment(code, node)
        try: eval(compile(ast.Expression(node.value), '<show_doc>', 'eval'), {**ns, 'show_doc': show_doc})
        except Exception as e: raise DocError(f'{expr}: {type(e).__name__}: {e}') from e
    return out

def _shown(nb) -> set:
    "Names a notebook documents with `show_doc` cells of its own"
    return {m[1].strip() for c in nb['cells'] if c['cell_type'] == 'code'
            for m in re.finditer(r'^show_doc\(\s*([\w.]+)', src(c), re.M)}

# ---- cells

def _md(text:str, i:int) -> dict:
    return dict(cell_type='markdown', id=f'doc{i:05d}', metadata={}, source=text)

def _fix_img(text:str) -> str: return text.replace('../docs/img/', 'img/')

def _outputs(outs) -> list:
    res = []
    for o in outs:
        o = dict(o)
        if o.get('output_type') == 'stream': o['text'] = _ANSI.sub('', ''.join(o['text']) if isinstance(o['text'], list) else o['text'])
        res.append(o)
    return res

def entry_name(cell) -> str|None:
    "The name an API entry cell documents (`Learner.profile`); None for any other cell"
    if cell['cell_type'] == 'markdown' and cell['id'].startswith('doc'): return re.match(r'#+ (.+)', src(cell))[1].strip()

def _heading(cell) -> bool: return cell['cell_type'] == 'markdown' and not cell['id'].startswith('doc') and src(cell).startswith('#')

def lead_with(cells, first) -> tuple:
    """`cells` with the entries `first` names (`fnmatch` patterns, in that order) moved up to right after the page's
    introduction (before its first heading, entry or code cell), each with the cells that follow it up to the next entry or heading (its
    examples); the rest keeps the notebook's order. Also returns the patterns that matched no entry."""
    blocks, taken, missing = [], set(), []
    for pat in first:
        hits = [i for i,c in enumerate(cells) if i not in taken and (nm := entry_name(c)) and fnmatch.fnmatchcase(nm, pat)]
        if not hits: missing.append(pat)
        for i in hits:
            j = i + 1
            while j < len(cells) and entry_name(cells[j]) is None and not _heading(cells[j]): j += 1
            blocks.append(range(i, j)); taken.update(range(i, j))
    at = next((i for i,c in enumerate(cells) if i and (c['cell_type'] == 'code' or entry_name(c) or _heading(c))),
              len(cells))  # the introduction: the title and the prose up to the first section, entry or code
    lead = [cells[i] for b in blocks for i in b]
    return [c for i,c in enumerate(cells[:at]) if i not in taken] + lead + [c for i,c in enumerate(cells) if i >= at and i not in taken], missing

def end_sentences(cells) -> list:
    """A prose cell that ends with a colon introduces the cell after it in the notebook; where the site leaves that cell out
    (a test or a private export) and what follows is prose, a heading or nothing, the colon becomes a full stop"""
    out = []
    for i,c in enumerate(cells):
        nxt = cells[i+1] if i + 1 < len(cells) else None
        if (c['cell_type'] == 'markdown' and entry_name(c) is None and src(c).rstrip().endswith(':')
            and (nxt is None or (nxt['cell_type'] == 'markdown' and entry_name(nxt) is None))):
            c = dict(c, source=src(c).rstrip()[:-1] + '.')
        out.append(c)
    return out

def process(path, notes:list|None=None) -> dict:
    "The notebook at `path` as the docs show it (module docstring); `notes` collects what was left out and why"
    path = Path(path)
    nb = json.loads(path.read_text(encoding='utf-8'))
    mod, shown, cells, ns = default_exp(nb), _shown(nb), [], None
    notes = [] if notes is None else notes
    first = []  # `#| docs_first: ...`: the entries the page opens with
    for c in nb['cells']:
        if c['cell_type'] == 'markdown':
            cells.append(dict(cell_type='markdown', id=c.get('id', f'md{len(cells)}'), metadata={}, source=_fix_img(src(c))))
            continue
        if c['cell_type'] != 'code': continue
        d, body = directives(src(c))
        first += d.get('docs_first', '').split()
        if d.keys() & HIDE or d.get('include') == 'false' or not body.strip(): continue
        if d.keys() & {'export', 'exports'}:
            if ns is None: ns = namespace(mod)
            for nm in _defined(body):
                if nm in shown: continue
                try: sym = eval(nm, ns)
                except Exception as e: notes.append(f'{path.name}: {nm} not found ({type(e).__name__}: {e})'); continue
                try: cells.append(_md(render(sym, nm), len(cells)))
                except Exception as e: notes.append(f'{path.name}: {nm} not rendered ({type(e).__name__}: {e})')
            if 'exports' not in d: continue
        elif re.match(r'show_doc\(', body):
            if ns is None: ns = namespace(mod)
            try: cells += [_md(m, len(cells)) for m in show_doc_cells(body, ns)]
            except DocError as e: raise DocError(f'{path.name}: {e}') from e
            continue
        elif is_test_cell(body): continue
        cells.append(dict(cell_type='code', execution_count=None, id=c.get('id', f'code{len(cells)}'), metadata={},
                          outputs=_outputs(c.get('outputs', [])), source=body))
    if first:
        cells, missing = lead_with(cells, first)
        if missing: raise DocError(f'{path.name}: docs_first names no entry of the page: {", ".join(missing)}')
    cells = end_sentences(cells)
    for i,c in enumerate(cells):
        if c['id'].startswith('doc'): c['id'] = f'doc{i:05d}'  # the API entries': unique in the notebook
    return dict(cells=cells, metadata=nb.get('metadata', {}), nbformat=4, nbformat_minor=5)

def nb2md(nb) -> str:
    "A processed notebook as markdown: prose and API entries as they are, code fenced, text outputs fenced"
    out = []
    for c in nb['cells']:
        if c['cell_type'] == 'markdown': out.append(src(c).strip('\n')); continue
        out.append(f"```python\n{src(c)}\n```")
        for o in c.get('outputs', []):
            txt = o.get('text') if o.get('output_type') == 'stream' else o.get('data', {}).get('text/plain')
            if txt: out.append('```\n' + (''.join(txt) if isinstance(txt, list) else txt).rstrip('\n') + '\n```')
    return '\n\n'.join(out) + '\n'

def process_all(src_dir, dest_dir) -> list:
    "Every notebook of `src_dir` processed into `dest_dir` (a file rewritten only when it changed; others removed)"
    src_dir, dest_dir = Path(src_dir), Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    notes, names = [], set()
    for p in sorted(src_dir.glob('*.ipynb')):
        if p.name.startswith(('_', '.')): continue
        names.add(p.name)
        text = json.dumps(process(p, notes), indent=1, ensure_ascii=False) + '\n'
        dest = dest_dir/p.name
        if not dest.exists() or dest.read_text(encoding='utf-8') != text: dest.write_text(text, encoding='utf-8')
    for q in dest_dir.glob('*.ipynb'):
        if q.name not in names: q.unlink()
    return notes

if __name__ == '__main__':
    import sys, time
    t = time.perf_counter()
    for n in process_all(ROOT/'nbs', sys.argv[1] if len(sys.argv) > 1 else ROOT/'_proc'/'docs'): print(n)
    print(f'{time.perf_counter()-t:.1f} s')
