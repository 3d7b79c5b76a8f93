"""The docs site (`mkdocs.yml`) builds from the committed notebooks, without running them and without a warning.

Needs the `docs` extra (`pip install -e ".[docs]"`); skipped without it."""
import html, importlib.util, json, os, re, subprocess, sys, time
from pathlib import Path
from urllib.parse import urlsplit, unquote
import pytest
sys.path.insert(0, str(Path(__file__).resolve().parent.parent/'docs'))
import links as docs_links  # docs/links.py: the pages' names and the `Docs:` links

ROOT = Path(__file__).resolve().parent.parent
BUILDER = ('mkdocs', 'material', 'mkdocs_jupyter')

def _text(o):
    "The text of an HTML fragment, or of the file `o`: tags and nbconvert's heading anchors dropped, entities decoded"
    s = o.read_text(encoding='utf-8') if isinstance(o, Path) else o
    s = re.sub(r'<a\s+class="anchor-link".*?</a>', '', s, flags=re.S)
    return re.sub(r'\s+', ' ', html.unescape(re.sub(r'<[^>]+>', '', s))).strip()

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

@pytest.mark.slow
def test_docs_build_strict(tmp_path):
    missing = [m for m in BUILDER if importlib.util.find_spec(m) is None]
    if missing: pytest.skip(f'the docs builder is not installed ({", ".join(missing)}): pip install -e ".[docs]"')
    site = tmp_path/'site'
    t = time.perf_counter()
    r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '-f', str(ROOT/'mkdocs.yml'), '-d', str(site)],
                       cwd=ROOT, capture_output=True, text=True, timeout=540, env=dict(os.environ, NO_MKDOCS_2_WARNING='1'))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    warnings = [l for l in out.splitlines() if l.startswith(('WARNING', 'ERROR'))]
    assert not warnings, warnings
    print(f'docs built in {time.perf_counter()-t:.1f} s, 0 warnings')
    # the home page is the README (nbs/index.ipynb, made from it), its images published beside it
    assert subprocess.run([sys.executable, str(ROOT/'docs'/'make_index.py'), '--check'], capture_output=True).returncode == 0, \
        'nbs/index.ipynb is not README.md: run python docs/make_index.py'
    readme = (ROOT/'README.md').read_text(encoding='utf-8')
    tagline = next(l[2:].strip() for l in readme.splitlines() if l.startswith('> '))
    assert tagline in _text(site/'index.html') and 'src="img/report.png"' in (site/'index.html').read_text(encoding='utf-8')
    assert (site/'img'/'report.png').stat().st_size > 0
    # every notebook has its page under nbdev's name (nbs/18_advice.ipynb -> advice.html), headed by its title, and
    # the page's markdown beside it
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):
        page = site/docs_links.page_name(nb.name)
        title = json.loads(nb.read_text(encoding='utf-8'))['cells'][0]['source'][0].strip()
        assert title.startswith('# '), (nb.name, title)
        h1 = re.search(r'<h1[^>]*>(.*?)</h1>', page.read_text(encoding='utf-8'), re.S)
        assert h1 and _text(h1[1]) == title[2:].replace('`', ''), (page.name, h1 and _text(h1[1]), title)
        summary = next((l[2:].strip() for l in json.loads(nb.read_text(encoding='utf-8'))['cells'][0]['source']
                        if l.startswith('> ')), '')
        plain = re.sub(r'[`*]', '', re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', summary))  # markdown's marks dropped
        assert plain in re.sub(r'[`*]', '', _text(page)), (page.name, summary)
        assert (site/(page.name + '.md')).read_text(encoding='utf-8').startswith(title + '\n'), page.name
    assert not list(site.glob('18_advice.html'))
    # every module's `Docs:` link (written by nbdev-export) names a page of this site
    base = docs_links.site_url(ROOT)
    mods = sorted(p for p in (ROOT/'fastprofile').rglob('*.py') if not p.name.startswith('_'))
    urls = {str(p.relative_to(ROOT)): docs_links.module_docs_url(p) for p in mods}
    assert all(u.startswith(base) for u in urls.values()), urls
    dead = {n: u for n, u in urls.items() if not (site/u[len(base):]).is_file()}
    assert not dead, dead
    # links between pages and to headings (the tables of contents included) lead somewhere
    assert not dead_links(site, urlsplit(base).path), dead_links(site, urlsplit(base).path)[:20]
