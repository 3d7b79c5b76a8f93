"""The docs site (`mkdocs.yml`) builds from a clean copy of the repository, without a warning, and reads as a user's site.

Built once per session from the files git would commit (tracked, and untracked but not ignored: no `_proc/`, no `site/`,
no stale outputs of an earlier build), by `mkdocs build --strict`. The checks read the built HTML: the guide comes
before the internals in the navigation; no directive, hidden cell, test cell, exported source or prompt is shown;
`show_doc` renders as API entries with their parameter tables (`Learner.profile`'s, first on its page), types as written in
code; every link leads somewhere, the 404 page's too. In Chromium (headless; those tests skip without it): text outputs keep
their lines (no mid-word wrap) and every markdown table shows each row whole.
Needs the docs builder (`pip install -e ".[dev]"` or `".[docs]"`); skipped without it."""
import ast, html, importlib.util, json, os, re, shutil, subprocess, sys, time
from pathlib import Path
from urllib.parse import urlsplit, unquote
import pytest
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT/'docs'))
import links as docs_links  # docs/links.py: the pages' names and the `Docs:` links
import nbproc               # docs/nbproc.py: what the site shows of a notebook

BUILDER = ('mkdocs', 'material', 'mkdocs_jupyter', 'nbdev')
NBS = sorted((ROOT/'nbs').glob('*.ipynb'))

def _text(o):
    "The text of an HTML fragment, or of the file `o`: tags and nbconvert's heading anchors dropped, entities decoded"
    s = o.read_text(encoding='utf-8') if isinstance(o, Path) else o
    s = re.sub(r'<a\s+class="anchor-link".*?</a>', '', s, flags=re.S)
    return re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', '', s))).strip()

def code_blocks(page:Path) -> list:
    "The source of each code cell shown on a notebook's page, as text"
    return [html.unescape(re.sub(r'<[^>]+>', '', m)) for m in
            re.findall(r'<div class="highlight-ipynb[^"]*"><pre>(.*?)</pre>', page.read_text(encoding='utf-8'), re.S)]

def dead_links(site, base_path):
    "Links and anchors in the built pages that lead nowhere (`mkdocs build --strict` checks those of markdown pages only)"
    bad = []
    for p in sorted(site.rglob('*.html')):
        text = p.read_text(encoding='utf-8')
        ids = set(re.findall(r'\bid="([^"]+)"', text))
        for link in map(html.unescape, re.findall(r'\b(?:href|src)="([^"]+)"', text)):
            u = urlsplit(link)
            if u.scheme or link.startswith('//'): continue
            path = unquote(u.path)
            if not path:
                if u.fragment and unquote(u.fragment) not in ids: bad.append(f'{p.name}: {link}')
                continue
            q = site/path[len(base_path):] if path.startswith(base_path) else (p.parent/path).resolve()
            if q.is_dir(): q = q/'index.html'
            if not q.is_file() or (u.fragment and q.suffix == '.html' and f'id="{u.fragment}"' not in q.read_text(encoding='utf-8')):
                bad.append(f'{p.name}: {link}')
    return bad

def clean_copy(dest:Path) -> Path:
    "The files git would commit (tracked and present, or untracked and not ignored) copied into `dest`"
    r = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=ROOT, capture_output=True)
    if r.returncode == 0: files = [f for f in r.stdout.decode().split('\0') if f and (ROOT/f).is_file()]
    else:  # not a git checkout: everything but what a build or a venv leaves
        skip = {'.git', '.venv', 'site', '_proc', '__pycache__', '.pytest_cache', 'wandb', 'models'}
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob('*') if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    for f in files:
        (dest/f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT/f, dest/f)
    return dest

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The site built by `mkdocs build --strict` from a clean copy of the repository: (site folder, the copy, build output)"
    missing = [m for m in BUILDER if importlib.util.find_spec(m) is None]
    if missing: pytest.skip(f'the docs builder is not installed ({", ".join(missing)}): pip install -e ".[dev]"')
    repo = clean_copy(tmp_path_factory.mktemp('repo'))
    assert not (repo/'_proc').exists() and not (repo/'site').exists()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '-d', str(repo/'site')], cwd=repo,
                       capture_output=True, text=True, timeout=540, env=dict(os.environ, NO_MKDOCS_2_WARNING='1'))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    print(f'docs built from a clean copy in {time.perf_counter()-t:.1f} s')
    return repo/'site', repo, out

def test_builds_without_warnings(site):
    warnings = [l for l in site[2].splitlines() if l.startswith(('WARNING', 'ERROR'))]
    assert not warnings, warnings

def test_guide_first_internals_last(site):
    "The navigation: Home, the guide (Getting started first), the API (`Learner.profile` first), then the internals"
    nav = (site[0]/'index.html').read_text(encoding='utf-8')
    nav = nav[nav.index('md-nav--primary'):]
    labels = [l for l in (_text(x) for x in re.findall(r'<label class="md-nav__link"[^>]*>(.*?)</label>', nav, re.S))
              if l in ('Guide', 'API', 'Internals')]
    assert labels[:3] == ['Guide', 'API', 'Internals'], labels
    links = [h for h in re.findall(r'<a href="([^"#]+\.html)" class="md-nav__link', nav)]
    first = lambda page: links.index(page)
    assert first('guide_start.html') < first('guide_report.html') < first('learner.html') < first('core.html') < first('stats.html')
    assert links[1] == 'guide_start.html', links[:3]  # right after Home
    guides = [p for p in NBS if p.name.startswith('guide_')]
    assert len(guides) >= 8 and all(first(docs_links.page_name(p.name)) < first('learner.html') for p in guides)

def test_pages_show_no_plumbing(site):
    "No directive line, no `#| hide` or test cell, no exported source and no `In [ ]:` prompt on any page"
    checked = 0
    for nb in NBS:
        page = site[0]/docs_links.page_name(nb.name)
        shown = code_blocks(page)
        text = page.read_text(encoding='utf-8')
        assert not re.search(r'In&nbsp;\[|In \[\s*\d*\s*\]:', text), f'{page.name}: a prompt'
        assert not [c for c in shown if re.search(r'^#\|', c, re.M)], f'{page.name}: a directive shown'
        assert not [c for c in shown if nbproc.is_test_cell(c)], f'{page.name}: a test cell shown'
        for c in json.loads(nb.read_text(encoding='utf-8'))['cells']:
            if c['cell_type'] != 'code': continue
            d, body = nbproc.directives(nbproc.src(c))
            hidden = d.keys() & {'hide', 'export', 'exporti', 'default_exp'} or nbproc.is_test_cell(body)
            if hidden and body.strip():
                checked += 1
                assert body.strip() not in [s.strip() for s in shown], f'{page.name}: shows the cell {body[:80]!r}'
    assert checked > 300  # the notebooks' hidden, exported and test cells, each looked for

def test_api_entries(site):
    "`show_doc` renders: `Learner.profile` has its signature and a parameter table from its docments"
    page = (site[0]/'learner.html').read_text(encoding='utf-8')
    start = [m.start() for m in re.finditer(r'<h3 id="learnerprofile"', page)]
    assert start, 'no API entry for Learner.profile'
    entry = page[start[0]:page.index('<h3', start[0] + 10)]
    assert 'Learner.profile(' in _text(entry)  # the signature
    table = re.search(r'<table>(.*?)</table>', entry, re.S)
    assert table, 'no parameter table'
    head, rows = _text(re.search(r'<thead>(.*?)</thead>', table[1], re.S)[1]), re.findall(r'<tr>(.*?)</tr>', table[1], re.S)
    assert head.split() == ['Type', 'Default', 'Details'], head
    params = {_text(re.findall(r'<td[^>]*>(.*?)</td>', r, re.S)[0]) for r in rows if '<td' in r}
    assert {'logger_callback', 'breakdown', 'layers', 'telemetry', 'probes'} <= params, params
    assert 'Also split draw into wait' in _text(table[1])  # `breakdown`'s docment
    # every explicit show_doc cell of every notebook became an entry: no `show_doc(` is left as code
    for nb in NBS:
        assert not [c for c in code_blocks(site[0]/docs_links.page_name(nb.name)) if c.lstrip().startswith('show_doc(')], nb.name

def test_every_page_and_link(site):
    "Each notebook has its page under nbdev's name with its title and markdown; `Docs:` links and all links lead somewhere"
    s, repo = site[0], site[1]
    assert subprocess.run([sys.executable, str(repo/'docs'/'make_index.py'), '--check'], capture_output=True).returncode == 0, \
        'nbs/index.ipynb is not README.md: run python docs/make_index.py'
    readme = (repo/'README.md').read_text(encoding='utf-8')
    tagline = next(l[2:].strip() for l in readme.splitlines() if l.startswith('> '))
    index = (s/'index.html').read_text(encoding='utf-8')
    assert tagline in _text(index) and 'src="img/report.png"' in index and (s/'img'/'report.png').stat().st_size > 0
    for nb in NBS:
        page = s/docs_links.page_name(nb.name)
        cell0 = json.loads(nb.read_text(encoding='utf-8'))['cells'][0]['source']
        title = cell0[0].strip()
        assert title.startswith('# '), (nb.name, title)
        h1 = re.search(r'<h1[^>]*>(.*?)</h1>', page.read_text(encoding='utf-8'), re.S)
        assert h1 and _text(h1[1]) == title[2:].replace('`', ''), (page.name, h1 and _text(h1[1]), title)
        assert (s/(page.name + '.md')).read_text(encoding='utf-8').startswith(title + '\n'), page.name
    assert not list(s.glob('18_advice.html'))
    base = docs_links.site_url(repo)
    mods = sorted(p for p in (repo/'fastprofile').rglob('*.py') if not p.name.startswith('_'))
    urls = {str(p.relative_to(repo)): docs_links.module_docs_url(p) for p in mods}
    assert all(u.startswith(base) for u in urls.values()), urls
    dead = {n: u for n, u in urls.items() if not (s/u[len(base):]).is_file()}
    assert not dead, dead
    bad = dead_links(s, urlsplit(base).path)
    assert not bad, bad[:20]

# ---- the pages as a browser lays them out (Chromium, headless): computed styles and line boxes, not the CSS files' text

CHROMIUM = next((c for c in ('chromium', 'chromium-browser', 'google-chrome') if shutil.which(c)), None)

def in_chromium(page:Path, script:str, html_text:str|None=None, width:int=1280):
    """The value of `script` (the body of a JavaScript function returning something JSON can hold) run in `page` once Chromium
    has loaded and laid it out at `width` pixels; `html_text` replaces the page's HTML (the copy sits next to it, so its links
    still work)."""
    if CHROMIUM is None: pytest.skip('Chromium is not installed (CI installs it)')
    probe = page.with_name(f'_probe_{page.name}')
    inj = ('<script>window.addEventListener("load", () => { let r; try { r = (() => { ' + script + ' })(); } '
           'catch (e) { r = {error: String(e)}; } const p = document.createElement("pre"); p.id = "fp-probe"; '
           'p.textContent = JSON.stringify(r); document.body.appendChild(p); });</script>')
    text = page.read_text(encoding='utf-8') if html_text is None else html_text
    probe.write_text(text.replace('</body>', inj + '</body>'), encoding='utf-8')
    try: r = subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', f'--window-size={width},2000',
                             '--virtual-time-budget=5000', '--dump-dom', probe.as_uri()], capture_output=True, text=True, timeout=120)
    finally: probe.unlink()
    m = re.search(r'<pre id="fp-probe">(.*?)</pre>', r.stdout, re.S)
    assert m, f'{page.name}: no result from Chromium: {r.stderr[-2000:]}'
    res = json.loads(html.unescape(m[1]))
    assert not (isinstance(res, dict) and 'error' in res), res
    return res

# Each text output's computed style, how many lines its text has and how many line boxes the browser made of it
_OUTPUT_LINES = """
const out = [];
for (const pre of document.querySelectorAll('.jp-OutputArea-output pre')) {
  const cs = getComputedStyle(pre), lh = parseFloat(cs.lineHeight) || 1.2 * parseFloat(cs.fontSize);
  const r = document.createRange(); r.selectNodeContents(pre);
  const tops = [...r.getClientRects()].filter(x => x.width > 0).map(x => x.top).sort((a, b) => a - b);
  let boxes = 0, last = -1e9;
  for (const t of tops) if (t - last > lh / 2) { boxes++; last = t; }
  out.push({white_space: cs.whiteSpace, word_break: cs.wordBreak, overflow_wrap: cs.overflowWrap,
            lines: pre.textContent.replace(/\\n+$/, '').split('\\n').length, boxes, wide: pre.scrollWidth > pre.clientWidth,
            head: pre.textContent.slice(0, 60)});
}
return out;"""

_TEXT_OUTPUT = re.compile(r'<div class="jp-RenderedText[^"]*"[^>]*>\s*<pre>.*?</pre>\s*</div>', re.S)

def test_outputs_keep_their_lines(site):
    """In Chromium, every text output of the guide keeps its lines: as many line boxes as its text has lines (nothing wraps,
    so nothing wraps mid-word: "dom / inates"), and a style that cannot break inside a word; a wide one scrolls sideways.
    mkdocs-jupyter's `notebook-*.css` is linked after the site's stylesheet and wins a tie, which reading the CSS missed.
    The guide's outputs are laid out in one page, 'Reading the report', in place of its first (the pages share stylesheets)."""
    guides = sorted(site[0].glob('guide_*.html'))
    outs = [o for p in guides for o in _TEXT_OUTPUT.findall(p.read_text(encoding='utf-8'))]
    assert len(guides) >= 8 and len(outs) >= 10, (len(guides), len(outs))
    page = site[0]/'guide_report.html'
    text = page.read_text(encoding='utf-8')
    m = _TEXT_OUTPUT.search(text)
    res = in_chromium(page, _OUTPUT_LINES, text[:m.start()] + ''.join(outs) + text[m.end():])
    assert len(res) >= len(outs)
    for o in res:
        assert o['white_space'] in ('pre', 'nowrap') or (o['word_break'] != 'break-all' and o['overflow_wrap'] == 'normal'), o
        assert o['boxes'] <= o['lines'], o  # a line the browser broke in two (a blank line makes no box)
    assert sum(o['wide'] for o in res) >= 3  # outputs wider than the page: the check can fail

_TABLE_CELLS = """
const out = [];
for (const t of document.querySelectorAll('.jp-MarkdownOutput table')) {
  const box = t.closest('.md-typeset__scrollwrap') || t.parentElement;
  out.push({page: t.dataset.page || null, first: (t.querySelector('td') || t).textContent.trim().slice(0, 40),
            overflow: box.scrollWidth - box.clientWidth,
            clipped: [...t.querySelectorAll('td, th')].filter(c => c.scrollWidth > c.clientWidth + 1).map(c => c.textContent.slice(0, 40))});
}
return out;"""

def test_tables_show_every_row_whole(site):
    """In Chromium, every table written in markdown (the API's parameter tables, the guide's) fits its page: no cell is cut off
    (its content wider than the cell) and the table is no wider than the box that holds it (Material's scrolling wrapper cut
    the Details column off: "each ran", "on a GP"). All the site's tables are laid out in one page, the learner's, in place of
    its first one (every notebook page has the same column and stylesheets)."""
    tables = [(p.name, t) for p in sorted(site[0].glob('*.html'))
              for t in re.findall(r'<table>.*?</table>', p.read_text(encoding='utf-8'), re.S)]
    assert len(tables) >= 60
    page = site[0]/'learner.html'
    text = page.read_text(encoding='utf-8')
    m = re.search(r'<table>.*?</table>', text, re.S)
    every = ''.join(t.replace('<table>', f'<table data-page="{n}">', 1) for n, t in tables)
    res = in_chromium(page, _TABLE_CELLS, text[:m.start()] + every + text[m.end():])
    assert len([r for r in res if r['page']]) == len(tables)
    bad = [r for r in res if r['overflow'] > 0 or r['clipped']]
    assert not bad, bad[:10]

def _entries(page:Path) -> list:
    "The API entries of a page, in order: the `<h3>` headings followed by a source link"
    text = page.read_text(encoding='utf-8')
    return [_text(h) for h in re.findall(r'<h3 id="[^"]*"[^>]*>((?:(?!</h3>).)*)</h3>\s*(?:<p>)?\s*<a class="fp-source"', text, re.S)]

def test_api_page_opens_with_what_a_user_calls(site):
    "The learner's page: `Learner.profile` first, then `Learner.profiling` and the `simple_profile*` properties, before any section"
    page = site[0]/'learner.html'
    names = [n.rstrip('¶').strip() for n in _entries(page)]
    props = [n for n in names if n.startswith('Learner.simple_profile')]
    assert names[0] == 'Learner.profile' and names[1] == 'Learner.profiling', names[:4]
    assert len(props) >= 6 and names[2:2 + len(props)] == props, names
    assert {'session_for', 'logger_sink', 'LearnerFacts'} <= set(names[2 + len(props):]), names  # the internals after
    text = page.read_text(encoding='utf-8')
    assert text.index('id="learnerprofile"') < text.index('<h2 id=')  # before the page's first section
    # the other pages that declare theirs (`#| docs_first`), and no private class's methods as entries
    for name, lead in [('compare.html', ['compare', 'Comparison']), ('advice.html', ['check_advice', 'preserved']),
                       ('tune.html', ['Learner.tune', 'TuneResult']), ('saving.html', ['ProfileResult.save', 'load_profile']),
                       ('prefetch.html', ['Learner.prefetch', 'CudaPrefetchCallback']), ('demo.html', ['make_demo_learner']),
                       ('trace.html', ['Learner.annotate', 'save_trace', 'RecordFunctionCallback'])]:
        names = [n.rstrip('¶').strip() for n in _entries(site[0]/name)]
        assert names[:len(lead)] == lead, (name, names)
    assert not [n for p in site[0].glob('*.html') for n in _entries(p) if re.match(r'_|\w+\._', n)]

def test_types_as_a_reader_writes_them(site):
    "Signatures and parameter tables show types as written in code: no quotes (`from __future__ import annotations`), no ForwardRef, no private class"
    mds = {p.name: p.read_text(encoding='utf-8') for p in site[0].glob('*.html.md')}
    for name, md in mds.items():
        assert 'ForwardRef(' not in md, name
        assert not re.search(r'^    \w+: \'[^\']*\'(?: = |,$)|\(\w+: \'', md, re.M), (name, re.search(r'.*: \'[^\']*\'.*', md)[0])
        assert not re.search(r'^\| \**\w+ \| _\w', md, re.M), name  # a type column naming a private class (`_Default`)
    learner = mds['learner.html.md']
    assert "| logger_callback | str | 'wandb' |" in learner
    assert "csv_name: str | Path = 'simple_profile.csv'" in learner
    row = re.search(r'### session_for.*?(\| \*\*Returns\*\* [^\n]*)', learner, re.S)[1]
    assert row.split('|')[1:-1] == [' **Returns** ', ' **Session** ', '  ', '  '], row  # not the `**kwargs` comment
    assert re.search(r"### session_for.*?\| \\\*\\\*kwargs \|  \|  \| `ProfileOptions` \|", learner, re.S)

def test_prose_ends_in_a_sentence(site):
    "A prose cell ending in a colon is followed on its page by what it introduces (code or an entry), never by prose or nothing"
    checked = 0
    for p in sorted((site[1]/'_proc'/'docs').glob('*.ipynb')):
        cells = json.loads(p.read_text(encoding='utf-8'))['cells']
        for c, nxt in zip(cells, cells[1:] + [None]):
            if c['cell_type'] != 'markdown' or nbproc.entry_name(c) or not nbproc.src(c).rstrip().endswith(':'): continue
            checked += 1
            assert nxt is not None and (nxt['cell_type'] == 'code' or nbproc.entry_name(nxt)), (p.name, nbproc.src(c)[-80:])
    assert checked >= 20
    assert '`SLOTS` names the marks.' in (site[0]/'record.html.md').read_text(encoding='utf-8')

def test_404_links_work_in_a_local_build(site):
    "The 404 page links relatively (MkDocs writes `/fastprofile/...`: dead when the built site is opened as files)"
    s = site[0]
    text = (s/'404.html').read_text(encoding='utf-8')
    links = [l for l in map(html.unescape, re.findall(r'\b(?:href|src)="([^"]+)"', text)) if not urlsplit(l).scheme]
    assert len(links) > 30
    assert not [l for l in links if l.startswith('/')], links[:5]
    assert not [l for l in links if not (s/unquote(urlsplit(l).path)).is_file()], links[:5]

def test_is_test_cell():
    "What the site leaves out as a test cell, and what it keeps"
    for code in ('test_eq(a, 1)', 'assert x\ntest_fail(f, contains="y")', '_l = f()\ntest_is(_l, None)',
                 'with warnings.catch_warnings():\n    test_warns(f)', 'for i in range(3): test_eq(i, i)'):
        assert nbproc.is_test_cell(code), code
    for code in ('learn = synth_learner()\ntest_eq(len(learn.cbs), 4)', 'learn.profile().fit(1)', '_x = 1',
                 '%%writefile f.py\ntest_eq(1, 1)', ''):
        assert not nbproc.is_test_cell(code), code
