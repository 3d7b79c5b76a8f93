"""Write `nbs/index.ipynb`, the docs site's home page, from README.md: one markdown cell per `## ` section.

The README is written by hand (no Quarto here for `nbdev-readme`); this notebook is made from it, not the other way
round. It has no code and no nbdev directive, so `nbdev-export` makes nothing of it and `nbdev-test` runs nothing.
Links into the repository (`docs/img/...`) are made relative to `nbs/`; links to the docs site (`site_url` of
mkdocs.yml) become links between its pages, and links to the repository's own markdown files (`CONTRIBUTING.md`)
links to them on GitHub (`repo_url`), so that every link of the home page leads somewhere.

Usage: python docs/make_index.py [--check]   (`--check`: exit 1 if nbs/index.ipynb is not what README.md makes)"""
import hashlib, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def _setting(name):
    m = re.search(rf'^{name}:\s*["\']?([^"\'\s#]+)', (ROOT/'mkdocs.yml').read_text(encoding='utf-8'), re.M)
    return m[1].rstrip('/') + '/'

def index_nb(readme):
    "The index notebook's JSON text for README text `readme`"
    text = readme.replace('](docs/', '](../docs/')  # README links are relative to the repo root; the notebook is in nbs/
    text = text.replace('](' + _setting('site_url'), '](')  # the site's own pages, linked within the site
    text = re.sub(r'\]\(([A-Z]+\.md)\)', lambda m: f"]({_setting('repo_url')}blob/main/{m[1]})", text)  # CONTRIBUTING.md...
    cells, cur, fence = [], [], False
    for line in text.splitlines():
        if line.startswith('```'): fence = not fence
        if not fence and line.startswith('## ') and cur: cells.append(cur); cur = []
        cur.append(line)
    if cur: cells.append(cur)
    def cell(lines, i):
        return dict(cell_type='markdown', id=hashlib.sha1(f'index{i}'.encode()).hexdigest()[:8], metadata={},
                    source='\n'.join(lines).strip('\n').splitlines(True))
    nb = dict(cells=[cell(c, i) for i, c in enumerate(cells)],
              metadata=dict(jupytext=dict(cell_metadata_filter='-all', main_language='python', notebook_metadata_filter='-all')),
              nbformat=4, nbformat_minor=5)
    return json.dumps(nb, indent=1, ensure_ascii=False) + '\n'

def main(argv):
    want = index_nb((ROOT/'README.md').read_text(encoding='utf-8'))
    dest = ROOT/'nbs'/'index.ipynb'
    if '--check' in argv:
        ok = dest.exists() and dest.read_text(encoding='utf-8') == want
        print('nbs/index.ipynb is README.md' if ok else 'nbs/index.ipynb is not README.md: run python docs/make_index.py')
        return 0 if ok else 1
    dest.write_text(want, encoding='utf-8')
    print(f'wrote {dest.relative_to(ROOT)}')
    return 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
