"""The docs site (`mkdocs.yml`) builds from a clean copy of the repository, without a warning, and reads as a user's site.

Built once per session from the files git would commit (tracked, and untracked but not ignored: no `_proc/`, no `site/`,
no stale outputs of an earlier build), by `mkdocs build --strict`. The checks read the built HTML: the guide comes
before the internals in the navigation; no directive, hidden cell, test cell, exported source or prompt is shown;
`show_doc` renders as API entries with their parameter tables (`Learner.profile`'s); every link leads somewhere.
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

def test_outputs_scroll_and_keep_their_words(site):
    "Wide outputs and code scroll sideways; text outputs never break mid-word (the site's stylesheet, linked on each page)"
    css = (site[0]/'css'/'fastprofile.css').read_text(encoding='utf-8')
    rule = re.search(r'\.jp-OutputArea-output pre,[^{]*\{([^}]*)\}', css)
    assert rule and 'white-space: pre;' in rule[1] and 'word-break: normal;' in rule[1] and 'overflow-x: auto;' in rule[1]
    assert 'css/fastprofile.css' in (site[0]/'guide_report.html').read_text(encoding='utf-8')

def test_is_test_cell():
    "What the site leaves out as a test cell, and what it keeps"
    for code in ('test_eq(a, 1)', 'assert x\ntest_fail(f, contains="y")', '_l = f()\ntest_is(_l, None)',
                 'with warnings.catch_warnings():\n    test_warns(f)', 'for i in range(3): test_eq(i, i)'):
        assert nbproc.is_test_cell(code), code
    for code in ('learn = synth_learner()\ntest_eq(len(learn.cbs), 4)', 'learn.profile().fit(1)', '_x = 1',
                 '%%writefile f.py\ntest_eq(1, 1)', ''):
        assert not nbproc.is_test_cell(code), code
