"""MkDocs hooks for the docs site (`mkdocs.yml`: `hooks:`); nothing here runs a notebook.

- Before MkDocs reads any page, every notebook of `nbs/` is processed into `_proc/docs/` (`docs/nbproc.py`, what
  nbdev's processors do before Quarto renders): directives, hidden cells and test cells left out, `show_doc` and each
  exported symbol rendered as an API entry (signature, docstring, parameter table). `_proc/docs/` is the site's
  `docs_dir`; `nbs/` is watched by `mkdocs serve`, and the edit links still point at `nbs/`.
- Each notebook's page gets nbdev's name: `nbs/18_advice.ipynb` -> `advice.html` (the numeric prefix dropped, as
  `nbdev.config.nbpath2html` does), so the `Docs: https://fastprofile.github.io/fastprofile/advice.html.md` line that
  `nbdev-export` ends every module docstring with points into this site.
- Next to each page, `advice.html.md`: the processed notebook as plain markdown (prose, API entries, code, text
  outputs), the page those `Docs:` links name.
- A notebook page's table of contents is made from its rendered headings: mkdocs-jupyter's own drops code spans
  from titles and anchors (`## `preserved`: ...` became `: ...`, linking to an id the page does not have).
- The stylesheets mkdocs-jupyter puts inline in every notebook page (about 0.6 MB each) are written once, to
  `assets/notebook-<hash>.css`, and linked where they were (the site: 16 MB instead of 40).
- The 404 page's links are relative (MkDocs makes them absolute from `site_url`: dead in a local build).
- `docs/img/*` is published as `img/*`, `docs/css/*` as `css/*` (`extra_css`): the index notebook links
  `../docs/img/...` (right from `nbs/` in Jupyter and on GitHub), rewritten to `img/...` on its pages."""
import hashlib, json, logging, os, re, sys, time, warnings
from urllib.parse import urlsplit
from pathlib import Path
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.structure.toc import get_toc

ROOT = Path(__file__).resolve().parent.parent
NBS, PROC = ROOT/'nbs', ROOT/'_proc'/'docs'
ASSETS = {'img': ROOT/'docs'/'img', 'css': ROOT/'docs'/'css'}
log = logging.getLogger('mkdocs.hooks.fastprofile')
sys.path.insert(0, str(ROOT/'docs'))
import nbproc  # docs/nbproc.py

@event_priority(100)  # before mkdocs-jupyter and before MkDocs collects the pages
def on_config(config):
    "Process `nbs/` into `_proc/docs/` and build the site from there"
    t = time.perf_counter()
    with warnings.catch_warnings():  # importing fastai and torch to render the API: their deprecation notes are not the site's
        warnings.simplefilter('ignore')
        notes = nbproc.process_all(NBS, PROC)
    for n in notes: log.info(f'docs: left out of the API reference: {n}')
    log.info(f'docs: {len(list(PROC.glob("*.ipynb")))} notebooks processed in {time.perf_counter()-t:.1f} s')
    config['docs_dir'] = str(PROC)
    if str(NBS) not in config['watch']: config['watch'].append(str(NBS))
    return config

def page_name(nb_name):
    "nbdev's page name for a notebook file name: `18_advice.ipynb` -> `advice.html` (`nbdev.config.nbpath2html`)"
    return re.sub(r'^\d+[a-zA-Z0-9]*_', '', Path(nb_name).name.lower()).rsplit('.', 1)[0] + '.html'

def _is_nb(f): return f.src_uri.endswith('.ipynb') and f.is_documentation_page()

@event_priority(-100)  # after mkdocs-jupyter has made the notebooks pages
def on_files(files, config):
    seen = {}
    for f in files:
        if not _is_nb(f): continue
        if '/' in f.src_uri: raise ValueError(f'{f.src_uri}: the docs expect notebooks directly in nbs/')
        dest = page_name(f.src_uri)
        if dest in seen: raise ValueError(f'{f.src_uri} and {seen[dest]} would both be {dest}')
        seen[dest] = f.src_uri
        f.dest_uri, f.url = dest, dest
        f.abs_dest_path = os.path.normpath(os.path.join(config['site_dir'], dest))
    for sub, d in ASSETS.items():
        for p in sorted(d.glob('*')):
            if p.is_file(): files.append(File(f'{sub}/{p.name}', str(d.parent), config['site_dir'], False))
    return files

def _fix_img(text): return text.replace('../docs/img/', 'img/')

_HEAD = re.compile(r'<h([1-6])\s+id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)
_ANCHOR = re.compile(r'<a\s+class="anchor-link".*?</a>', re.S)

def html_toc(html):
    "Python-Markdown style TOC tokens from the `<hN id=...>` headings of `html` (titles as text, HTML-escaped)"
    root = dict(level=0, children=[])
    stack = [root]
    for lvl, hid, body in _HEAD.findall(html):
        name = re.sub(r'\s+', ' ', re.sub(r'<[^>]+>', '', _ANCHOR.sub('', body))).strip()
        tok = dict(level=int(lvl), id=hid, name=name, children=[])
        while stack[-1]['level'] >= tok['level']: stack.pop()
        stack[-1]['children'].append(tok)
        stack.append(tok)
    return root['children']

_STYLE = re.compile(r'<style type="text/css">(.*?)</style>', re.S)
_CSS = {}  # file name in the site -> its text

def _link_css(html, up):
    "Inline stylesheets over 2 kB in `html` made links to shared files (`up`: the page's way back to the site root)"
    def sub(m):
        if len(m[1]) < 2048: return m[0]
        name = f'assets/notebook-{hashlib.sha1(m[1].encode()).hexdigest()[:12]}.css'
        _CSS[name] = m[1]
        return f'<link rel="stylesheet" href="{up}{name}">'
    return _STYLE.sub(sub, html)

def on_page_content(html, page, config, files):
    if not _is_nb(page.file): return html
    page.toc = get_toc(html_toc(html))
    return _link_css(_fix_img(html), '../' * page.file.url.count('/'))

def on_post_template(output, template_name, config):
    """The 404 page's links made relative: MkDocs writes them from the root of `site_url` (`/fastprofile/...`), dead in a
    local build opened as files. The site is flat (every page at its root), so they are right for a missing page there; a
    script puts the root back as the page's `<base>` when it is served (GitHub Pages shows it for a missing page at any depth)."""
    if template_name != '404.html': return output
    root = urlsplit(config['site_url'] or '').path.rstrip('/') + '/'
    if root == '/': return output
    output = re.sub(rf'((?:href|src)="){re.escape(root)}([^"]*)"', lambda m: f'{m[1]}{m[2] or "index.html"}"', output)
    base = (f"<script>if (location.protocol !== 'file:') document.head.appendChild(Object.assign("
            f"document.createElement('base'), {{href: '{root}'}}))</script>")
    return output.replace('<head>', '<head>\n' + base, 1)

def on_post_build(config):
    "The shared stylesheets; `<page>.html.md` beside each notebook's page"
    for name, css in _CSS.items():
        dest = Path(config['site_dir'])/name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(css, encoding='utf-8')
    for p in sorted(Path(config['docs_dir']).glob('*.ipynb')):
        dest = Path(config['site_dir'])/(page_name(p.name) + '.md')
        if dest.with_suffix('').exists():
            dest.write_text(nbproc.nb2md(json.loads(p.read_text(encoding='utf-8'))), encoding='utf-8')
