#!/usr/bin/env python3
"""Point every `Docs:` link at its notebook's page on the docs site (mkdocs.yml; docs/mkdocs_hooks.py names the pages).

A notebook's page is nbdev's name for it: `nbs/18_advice.ipynb` -> `<site_url>advice.html`, with the markdown
`<site_url>advice.html.md` beside it (the numeric prefix dropped, as `nbdev.config.nbpath2html` does).

1. Rewrites any `Docs: <url>` written in a notebook's cells (markdown or code) to `<site_url><page>.html.md`, editing
   the cells' sources only, and writes a changed notebook back as nbdev does (`indent=1`, `ensure_ascii=False`).
2. Checks the `Docs:` line that `nbdev-export` puts at the end of each module docstring (made from pyproject.toml's
   `[project.urls] Documentation` and the notebook's name, not from the notebook's text): run `nbdev-export` after this
   script; a mismatch left is reported, and the exit status is 1.

Usage: python docs/links.py [REPO]   (default: the repository this script is in); `--check`: change nothing."""
import ast, json, re, sys
from pathlib import Path

DOCS_RE = re.compile(r'(Docs:\s*)(https?://\S+?)([)\]>"\'`]*(?:\s|$))')

def page_name(nb_name):
    "nbdev's page name for a notebook file name: `18_advice.ipynb` -> `advice.html` (as docs/mkdocs_hooks.py)"
    return re.sub(r'^\d+[a-zA-Z0-9]*_', '', Path(nb_name).name.lower()).rsplit('.', 1)[0] + '.html'

def site_url(root):
    m = re.search(r'^site_url:\s*["\']?([^"\'\s#]+)', (root/'mkdocs.yml').read_text(encoding='utf-8'), re.M)
    if not m: sys.exit(f'no site_url in {root/"mkdocs.yml"}')
    return m[1].rstrip('/') + '/'

def fix_notebook(path, url, check=False):
    "Rewrite `Docs:` links in the cells of the notebook at `path` to `url`; the number of links changed"
    nb = json.loads(path.read_text(encoding='utf-8'))
    n = 0
    for c in nb.get('cells', []):
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        def sub(m):
            nonlocal n
            if m[2] == url: return m[0]
            n += 1
            return m[1] + url + m[3]
        new = DOCS_RE.sub(sub, src)
        if new != src: c['source'] = new.splitlines(True) if isinstance(c['source'], list) else new
    if n and not check: path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
    return n

def default_exp(path):
    for c in json.loads(path.read_text(encoding='utf-8')).get('cells', []):
        if c['cell_type'] != 'code': continue
        m = re.search(r'^#\|\s*default_exp\s+(\S+)', ''.join(c['source']), re.M)
        if m: return m[1]

def module_docs_url(py):
    "The `Docs:` URL ending the module docstring of `py` ('' if none)"
    doc = ast.get_docstring(ast.parse(py.read_text(encoding='utf-8'))) or ''
    last = doc.strip().splitlines()[-1:] or ['']
    return last[0][5:].strip() if last[0].startswith('Docs:') else ''

def main(argv):
    check = '--check' in argv
    args = [a for a in argv if not a.startswith('--')]
    root = Path(args[0] if args else Path(__file__).parent.parent).resolve()
    base, lib = site_url(root), root/'fastprofile'
    changed, bad = 0, []
    for nb in sorted((root/'nbs').glob('*.ipynb')):
        url = base + page_name(nb.name) + '.md'
        n = fix_notebook(nb, url, check)
        if n: print(f'{nb.relative_to(root)}: {n} Docs: link(s) {"to change" if check else "now"} -> {url}')
        changed += n
        mod = default_exp(nb)
        if not mod: continue
        py = lib.joinpath(*mod.split('.')).with_suffix('.py')
        got = module_docs_url(py) if py.exists() else ''
        if got != url: bad.append(f'{py.relative_to(root)}: Docs: {got or "(none)"}, its page is {url}')
    print(f'{changed} notebook Docs: link(s) {"to change" if check else "changed"}; '
          f'{"all" if not bad else "not all"} module docstrings point at their pages')
    for b in bad: print('  ' + b)
    if bad: print('  (nbdev-export writes these from [project.urls] Documentation in pyproject.toml and the notebook name:'
                  ' run nbdev-export; if they still differ, make Documentation the site_url of mkdocs.yml)')
    return 1 if bad or (check and changed) else 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
