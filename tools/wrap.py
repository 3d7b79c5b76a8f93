#!/usr/bin/env python
"""Lines a reader follows: list the generated lines over the limit, or re-wrap notebooks' export cells to fit it.

    python tools/wrap.py --check [-v] [--limit 120]     # lines over the limit, per generated module
    python tools/wrap.py --fix nbs/NAME.ipynb ...       # re-wrap the export cells (and test-cell lines over 140)

A re-wrap keeps each cell's meaning: every change is kept only if `ast.dump(ast.parse(cell))` is the same before and
after (implicit string concatenation already joins adjacent literals into one constant; a docstring is compared with its
whitespace collapsed, since a wrapped docstring gains a line break). What it does, as a person would:
a compound one-liner (`if x: long`) becomes a block; statements joined by `;` go on their own lines; a line breaks
inside brackets, after a comma where it can, the rest aligned with the opening bracket (or indented by 4 when that
bracket sits far right); a long string is split at a space into adjacent literals (never inside an f-string's `{...}`);
a trailing comment goes above its line; long comments and docstrings are re-filled. What it cannot wrap it leaves."""
import argparse, ast, io, json, re, sys, tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPOUND = {'if','elif','else','for','while','with','try','except','finally','def','class','async'}
OPEN, CLOSE = '([{', ')]}'

def _tokens(src):
    "Tokens of `src`, or None where it does not tokenize"
    try: return list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError): return None

def _docstrings(tree):
    "Docstring nodes (an `Expr` of a `str` constant first in a module, class or function body)"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            b = node.body[0]
            if isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
                yield b.value

def norm_ast(src):
    "`ast.dump` of `src` with docstrings' whitespace collapsed; None where it does not parse"
    try: tree = ast.parse(src)
    except SyntaxError: return None
    for c in _docstrings(tree): c.value = ' '.join(c.value.split())
    return ast.dump(tree)

def _indent(line): return len(line) - len(line.lstrip(' '))

def _fill(words, first, width):
    "Split `words` into lines: the first may hold `first` characters, the others `width`"
    out, cur, room = [], '', first
    for w in words:
        if cur and len(cur) + 1 + len(w) > room: out.append(cur); cur, room = w, width
        else: cur = f'{cur} {w}' if cur else w
    return out + [cur]

def _split_at(text, room, avoid_ticks=True):
    "Index of the last space in `text` at or before `room` (outside `backticks` if possible), or None"
    best = None
    for i, ch in enumerate(text[:room+1]):
        if ch == ' ' and i > 0 and text[i-1] != ' ':
            if avoid_ticks and text[:i].count('`') % 2: continue
            best = i
    if best is None and avoid_ticks: return _split_at(text, room, False)
    return best

def _para_line(s):
    "Whether stripped line `s` continues a paragraph (not blank, not a list item, table, directive or example)"
    return bool(s) and not re.match(r'(-|\*|\||>>>|\d+[.)]|#\||```)', s)

class Wrapper:
    "Re-wrap one cell's source: each fix of a too-long line is kept only if the cell's AST is unchanged"
    def __init__(self, src, limit=120, over=None):
        self.src,self.limit,self.over,self.skip = src,limit,over or limit,set()

    def run(self):
        want = norm_ast(self.src)
        if want is None: return self.src
        made = set()
        for _ in range(400):
            lines = self.src.split('\n')
            # (`from fastprofile.x` is written `from .x` in the package: 9 characters or more shorter)
            todo = [i for i,l in enumerate(lines)
                    if len(l) > (self.limit if l in made else self.over) and l not in self.skip
                    and not (l.startswith('from fastprofile.') and len(l) - 9 <= self.limit)]
            if not todo: break
            i = todo[0]
            try: new = self.fix(lines, i)
            except Exception: new = None
            if new is None or norm_ast('\n'.join(new)) != want: self.skip.add(lines[i]); continue
            made |= set(new) - set(lines)  # a line made by a fix is wrapped to the limit
            self.src = '\n'.join(new)
        return self.src

    def fix(self, lines, i):
        toks = _tokens('\n'.join(lines))
        if toks is None: return None
        row = i + 1
        for t in toks:  # a string over several lines: only a docstring is re-filled
            if t.type == tokenize.STRING and t.start[0] < t.end[0] and t.start[0] <= row <= t.end[0]:
                return self.docstring(lines, i, t) if self.is_doc(t) else None
        on = [t for t in toks if t.start[0] == row and t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                                                           tokenize.DEDENT, tokenize.ENDMARKER)]
        if not on: return None
        if on[0].type == tokenize.COMMENT: return self.comment(lines, i)
        if on[-1].type == tokenize.COMMENT: return self.trailing_comment(lines, i, on[-1])
        if on[0].type == tokenize.STRING and self.is_doc(on[0]): return self.docstring(lines, i, on[0])
        # `from fastprofile.x import ...` stays on one line: nbdev writes it as `from .x` (9 characters or more
        # shorter), and a statement over several lines only where its last line ends right of the module name
        if lines[i].startswith('from fastprofile.'): return None
        for f in (self.block, self.semicolon, self.brackets):
            new = f(lines, i, toks, on)
            if new is not None: return new
        return None

    def is_doc(self, t):
        tree = ast.parse(self.src)
        return any(c.lineno == t.start[0] and c.col_offset == t.start[1] for c in _docstrings(tree))

    # comments
    def comment(self, lines, i):
        line = lines[i]; ind = _indent(line); text = line.strip()
        if text.startswith('#|'): return None
        m = re.match(r'#+ ?', text); mark, body = m.group().rstrip() + ' ', text[m.end():]
        k = _split_at(body, self.limit - ind - len(mark))
        if k is None: return None
        head, rest = body[:k], body[k+1:]
        new = lines[:i] + [' '*ind + mark + head]
        nxt = lines[i+1] if i+1 < len(lines) else ''
        if _indent(nxt) == ind and nxt.strip().startswith(mark) and _para_line(nxt.strip()[len(mark):].strip()) \
           and not nxt.strip().startswith('#|'):
            return new + [' '*ind + mark + rest + ' ' + nxt.strip()[len(mark):].strip()] + lines[i+2:]
        return new + [' '*ind + mark + rest] + lines[i+1:]

    def trailing_comment(self, lines, i, c):
        "Move a trailing comment above its line (as comment lines at the line's indentation)"
        line = lines[i]; ind = _indent(line)
        code, text = line[:c.start[1]].rstrip(), c.string
        d = re.match(r'#\s*(noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^]]*\])?|pragma:\s*no '
                     r'cover)\s*', text)
        if d:  # a linter's directive stays on its line; what it says after goes above
            code, text = code + '  # ' + d.group(1), '# ' + text[d.end():].strip('() ')
            if len(code) > self.limit or text == '# ': return None
        m = re.match(r'#+ ?', text); body = text[m.end():]
        out = _fill(body.split(' '), self.limit - ind - 2, self.limit - ind - 2)
        return lines[:i] + [' '*ind + '# ' + s for s in out] + [code] + lines[i+1:]

    # docstrings
    def docstring(self, lines, i, t):
        s = t.string
        m = re.match(r'([rRuU]?)("""|\'\'\'|"|\')', s)
        if m is None: return None
        pre, q = m.groups()
        if len(q) == 1:  # one line: made a triple-quoted docstring, filled at its own column
            body = s[len(m.group()):-1]
            if q*3 in body or body.endswith(q) or body.endswith('\\'): return None
            line = lines[i]; col = t.start[1]; after = line[t.end[1]:]
            out = _fill(body.split(' '), self.limit - col - len(pre) - 3, self.limit - col)
            out[-1] += q*3 + after
            return lines[:i] + [line[:col] + pre + q*3 + out[0]] + [' '*col + o for o in out[1:]] + lines[i+1:]
        line = lines[i]
        k = _split_at(line[_indent(line):], self.limit - _indent(line))
        if k is None: return None
        k += _indent(line)
        head, rest = line[:k], line[k+1:]
        ind = t.start[1] if i + 1 == t.start[0] else _indent(line)
        nxt = lines[i+1] if i + 1 < len(lines) else ''
        if i + 1 < t.end[0] and _para_line(nxt.strip()) and not nxt.strip().startswith(q):
            return lines[:i] + [head, ' '*_indent(nxt) + rest + ' ' + nxt.strip()] + lines[i+2:]
        return lines[:i] + [head, ' '*ind + rest] + lines[i+1:]

    # statements
    def _depths(self, toks):
        "Bracket stack before each token: list of (token, [open tokens])"
        stack, out = [], []
        for t in toks:
            out.append((t, list(stack)))
            if t.type == tokenize.OP and t.string in OPEN: stack.append(t)
            elif t.type == tokenize.OP and t.string in CLOSE and stack: stack.pop()
        return out

    def block(self, lines, i, toks, on):
        "A compound one-liner (`if x: body`) made a block, the body on its own line"
        row = i + 1; ds = self._depths(toks)
        lst = [(t, s) for t,s in ds if t.type not in (tokenize.NL, tokenize.COMMENT)]
        # the logical line holding `row`
        start = None
        for k,(t,s) in enumerate(lst):
            if t.start[0] > row: break
            if k == 0 or lst[k-1][0].type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT): start = k
        if start is None: return None
        first = lst[start][0]
        if first.type != tokenize.NAME or first.string not in COMPOUND: return None
        for k in range(start, len(lst)):
            t, s = lst[k]
            if t.type == tokenize.NEWLINE: return None
            if t.type == tokenize.NAME and t.string == 'lambda' and not s: return None
            if t.type == tokenize.OP and t.string == ':' and not s:
                body = lst[k+1][0]
                r = t.start[0]
                if body.type == tokenize.NEWLINE or body.start[0] != r or r > row: return None
                end = next(u for u,_ in lst[k:] if u.type == tokenize.NEWLINE).start[0]
                line = lines[r-1]; ind = _indent(lines[first.start[0]-1]) + 4
                delta = ind - body.start[1]
                moved = [' '*delta + l if delta >= 0 else l[min(-delta, _indent(l)):] for l in lines[r:end]]
                new = lines[:r-1] + [line[:t.end[1]], ' '*ind + line[body.start[1]:]] + moved + lines[end:]
                if end > r:  # the body over several lines: joined again where it now fits
                    nt = _tokens('\n'.join(new))
                    again = self.brackets(new, r, nt, None, force=True) if nt else None
                    if again is not None: new = again
                return new
        return None

    def semicolon(self, lines, i, toks, on):
        "Statements joined by `;` on their own lines (split at the last `;` that lets the first part fit)"
        semis = [t for t,s in self._depths(toks)
                 if t.start[0] == i+1 and t.type == tokenize.OP and t.string == ';' and not s]
        if not semis: return None
        fit = [t for t in semis if t.start[1] <= self.limit] or semis[:1]
        t = fit[-1]; line = lines[i]
        # the statement's indentation: that of the first line of its logical line, or the body of a one-liner
        row = i + 1
        while (row > 1 and lines[row-2].rstrip().endswith(('(', ',', '[', '{', '\\'))
               and _indent(lines[row-2]) < _indent(lines[row-1])):
            row -= 1
        ind = _indent(lines[row-1])
        return lines[:i] + [line[:t.start[1]].rstrip(), ' '*ind + line[t.end[1]:].lstrip()] + lines[i+1:]

    def brackets(self, lines, i, toks, on, force=False):
        "The statement holding line `i` laid out afresh (or that line alone where comments sit inside the statement)"
        row = i + 1
        body = [t for t in toks if t.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)]
        k0 = max((k+1 for k,t in enumerate(body) if t.type == tokenize.NEWLINE and t.start[0] < row), default=0)
        while k0 < len(body) and body[k0].type in (tokenize.NL, tokenize.COMMENT): k0 += 1
        k1 = next(k for k in range(k0, len(body)) if body[k].type in (tokenize.NEWLINE, tokenize.ENDMARKER))
        stmt = [t for t in body[k0:k1] if t.type != tokenize.NL]
        r0, r1 = stmt[0].start[0], stmt[-1].end[0]
        joined = not any(t.type == tokenize.COMMENT or (t.type == tokenize.STRING and t.start[0] != t.end[0])
                         for t in stmt)
        if joined: seg, depth, first, last = stmt, 0, r0, r1
        else:
            seg = [t for t in stmt if t.start[0] == row and t.type != tokenize.COMMENT]
            depth = len(next(s for t,s in self._depths(toks) if t is seg[0]))
            first = last = row
        if not seg: return None
        atoms, prev = [], None
        # a comma at a joined line break: spaced as the other commas between the same brackets are
        inner = {id(t): (id(s[-1]) if s else None) for t,s in self._depths(toks) if t.string == ','}
        spaced = {}
        for t in seg:
            if t.string == ',' and lines[t.start[0]-1][t.end[1]:t.end[1]+1] != '':
                spaced.setdefault(inner[id(t)], []).append(lines[t.start[0]-1][t.end[1]:t.end[1]+1] == ' ')
        for t in seg:
            if prev is None: space = ''
            elif prev.end[0] == t.start[0]: space = lines[t.start[0]-1][prev.end[1]:t.start[1]]
            elif prev.string in OPEN or t.string in CLOSE: space = ''
            elif prev.string == ',':
                v = spaced.get(inner.get(id(prev)), [])
                space = '' if v and sum(v) < len(v) - sum(v) else ' '
            else: space = ' '
            atoms.append(Atom(t.string, space, t.type))
            prev = t
        atoms = _merge_strings(atoms)
        lead = lines[first-1][:seg[0].start[1]]
        tail = lines[last-1][seg[-1].end[1]:]
        outs, bonus = [layout(build(atoms), lead, depth, self.limit, far) for far in (44, 64, 0)], {}
        d, eqs = 0, []
        for k,a in enumerate(atoms):
            if a.kind == tokenize.OP and a.text in OPEN: d += 1
            elif a.kind == tokenize.OP and a.text in CLOSE: d -= 1
            elif d == 0 and (a.kind == tokenize.OP and a.text in ('=','+=','-=','|=','*=') or k == 0
                             and a.text in ('return','yield')):
                eqs.append(k)
        if depth == 0 and len(eqs) == 1 and eqs[0] >= 0 and eqs[0] + 1 < len(atoms):
            eq = eqs[0]
            inner = [Atom(atoms[eq+1].text, '', atoms[eq+1].kind)] + atoms[eq+2:]
            wrapped = (atoms[:eq+1] + [Atom('(', atoms[eq+1].space or ' ', tokenize.OP)] + inner
                       + [Atom(')', '', tokenize.OP)])
            # an expression whose outermost operator is `x if c else y`, `and`, `or`, `+`: broken at that operator
            d, top = 0, False
            for a in atoms[eq+1:]:
                if a.kind == tokenize.OP and a.text in OPEN: d += 1
                elif a.kind == tokenize.OP and a.text in CLOSE: d -= 1
                elif d == 0 and a.text in ('if','else','and','or','+'): top = True
            for far in (44, 64):
                o = layout(build(wrapped), lead, depth, self.limit, far)
                if top: bonus[id(o)] = 25
                outs.append(o)
        # an `if`/`while` condition, an `assert` or the names of a `from ... import`: in parentheses
        cut = None
        if depth == 0 and atoms[0].text in ('if','elif','while') and atoms[-1].text == ':': cut = (1, len(atoms)-1)
        elif depth == 0 and atoms[0].text == 'assert': cut = (1, len(atoms))
        elif depth == 0 and atoms[0].text == 'from' and atoms[-1].text != ')':
            # the names continue at an indent of 4, as fastai's imports do
            k = next(k for k,a in enumerate(atoms) if a.text == 'import')
            head = lead + flat(atoms[:k+1]).lstrip() + ' ('
            names = [n for n in ''.join(a.space + a.text for a in atoms[k+1:]).split(',') if n.strip()]
            names = [' '.join(n.split()) for n in names]
            out = _fill([n + ',' for n in names[:-1]] + [names[-1] + ')'], self.limit - len(head), self.limit - 4)
            outs.append([head + out[0]] + ['    ' + o for o in out[1:]])
        if cut is not None and cut[0] < cut[1]:
            a0, a1 = cut
            inner = [Atom(atoms[a0].text, '', atoms[a0].kind)] + atoms[a0+1:a1]
            wrapped = atoms[:a0] + [Atom('(', ' ', tokenize.OP)] + inner + [Atom(')', '', tokenize.OP)] + atoms[a1:]
            outs += [layout(build(wrapped), lead, depth, self.limit, far) for far in (44, 64)]
        best = min(outs, key=lambda o: _score(o, self.limit) - bonus.get(id(o), 0))
        best[-1] += tail
        old = lines[first-1:last]
        if force:
            return (lines[:first-1] + best + lines[last:] if len(best) < len(old) and _score(best, self.limit) < 1000
                    else None)
        if best == old or _score(best, self.limit) >= _score(old, self.limit): return None
        return lines[:first-1] + best + lines[last:]

def _score(ls, lim):
    over = sum(max(0, len(l) - lim) for l in ls) + 50*sum(len(l) > lim for l in ls)
    far = sum(max(0, _indent(l) - 64) for l in ls[1:])
    hang = sum(l.rstrip()[-1:] in OPEN for l in ls[:-1])
    return 1000*over + 20*len(ls) + far + 30*hang + 6*_break_depth(ls)

def _break_depth(ls):
    "How deep inside brackets the lines break, beyond the shallowest break"
    ds, d, quote = [], 0, None
    for l in ls[:-1]:
        for k,ch in enumerate(l):
            if quote:
                if ch == quote and l[k-1] != '\\': quote = None
            elif ch in '\'"': quote = ch
            elif ch == '#': break
            elif ch in OPEN: d += 1
            elif ch in CLOSE: d -= 1
        ds.append(d)
    return sum(x - min(ds) for x in ds) if ds else 0

def _merge_strings(atoms):
    "Adjacent string literals joined into one where that is the same value (a layout splits them again where it must)"
    out = []
    for a in atoms:
        p = out[-1] if out else None
        if p is not None and p.kind == a.kind == tokenize.STRING:
            m, n = re.match(r'([rRbBuUfF]{0,2})(["\'])', p.text), re.match(r'([rRbBuUfF]{0,2})(["\'])', a.text)
            if m and n and m.group(2) == n.group(2) and not p.text.startswith(m.group() + m.group(2)*2) \
               and not a.text.startswith(n.group() + n.group(2)*2):
                (pp, x), (pa, z) = (m.group(1), p.text[m.end():-1]), (n.group(1), a.text[n.end():-1])
                fp, fa = 'f' in pp.lower(), 'f' in pa.lower()
                if (re.sub('[fF]', '', pp).lower() == re.sub('[fF]', '', pa).lower()
                    and not re.search(r'\\[0-7]{1,2}$|\\$', x) and not (fp and not fa and re.search('[{}]', z))
                    and not (fa and not fp and re.search('[{}]', x))):
                    pre = pp if fp else pa
                    out[-1] = Atom(pre + m.group(2) + x + z + m.group(2), p.space, p.kind); continue
        out.append(a)
    return out

class Atom:
    "A token's text and the space before it"
    def __init__(self, text, space, kind): self.text,self.space,self.kind = text,space,kind
    def __repr__(self): return self.text

class Group:
    "Brackets and what they hold"
    def __init__(self, open, items, close=None): self.open,self.items,self.close = open,items,close
    @property
    def space(self): return self.open.space

def build(atoms):
    "Atoms nested into `Group`s (a closer with no opener stays an atom)"
    stack = [[]]
    opens = []
    for a in atoms:
        if a.kind == tokenize.OP and a.text in OPEN: opens.append(a); stack.append([])
        elif a.kind == tokenize.OP and a.text in CLOSE and opens:
            items = stack.pop(); stack[-1].append(Group(opens.pop(), items, a))
        else: stack[-1].append(a)
    while opens: items = stack.pop(); stack[-1].append(Group(opens.pop(), items))
    return stack[0]

def flat(nodes, fresh=False):
    "Text of `nodes` on one line (no leading space where `fresh`)"
    out = []
    for n in nodes:
        if isinstance(n, Atom): out.append(n.space + n.text)
        else: out.append(n.open.space + n.open.text + flat(n.items) + (n.close.space + n.close.text if n.close else ''))
    s = ''.join(out)
    return s.lstrip(' ') if fresh else s

def segments(nodes, tier=0):
    """Split the nodes of one bracket level where a line may break: tier 0 after a comma (not in a `lambda`'s parameters
    or a comprehension) and between strings, tier 1 before `if`/`else`/`for`, tier 2 before `and`/`or`/`+`"""
    segs, cur = [], []
    compr = any(isinstance(n, Atom) and n.kind == tokenize.NAME and n.text == 'for' for n in nodes)
    lam = False
    for k,n in enumerate(nodes):
        prev = nodes[k-1] if k else None
        a = n if isinstance(n, Atom) else None
        if a is not None and a.kind == tokenize.NAME and a.text == 'lambda': lam = True
        if tier == 0:
            brk = (a is not None and a.kind == tokenize.STRING and isinstance(prev, Atom)
                   and prev.kind == tokenize.STRING)
        elif tier == 1: brk = a is not None and a.kind == tokenize.NAME and a.text in ('if','else','for')
        else:
            brk = a is not None and (a.kind == tokenize.NAME and a.text in ('and','or') or a.text == '+'
                                     and (isinstance(prev, Group) or isinstance(prev, Atom)
                                          and prev.kind in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)))
        if cur and brk: segs.append(cur); cur = []
        cur.append(n)
        if a is not None and a.kind == tokenize.OP and a.text == ':' and lam: lam = False
        if tier == 0 and a is not None and a.kind == tokenize.OP and a.text == ',' and not lam and not compr:
            segs.append(cur); cur = []
    return segs + ([cur] if cur else [])

class Out:
    def __init__(self, lead, lim): self.lines,self.lim,self.fresh = [lead],lim,True
    @property
    def col(self): return len(self.lines[-1])
    def put(self, s): self.lines[-1] += s.lstrip(' ') if self.fresh else s; self.fresh = False
    def newline(self, col): self.lines[-1] = self.lines[-1].rstrip(); self.lines.append(' '*col); self.fresh = True
    @property
    def indent(self): return _indent(self.lines[-1])

def _split_string(a, room):
    "Split string atom `a` at a space so that its first part takes at most `room` characters: (first, rest) or None"
    m = re.match(r'([rRbBuUfF]{0,2})(["\'])', a.text)
    if m is None or a.text.startswith(m.group() + m.group(2)*2): return None
    pre, q = m.groups(); body = a.text[m.end():-1]
    f = 'f' in pre.lower()
    depth, dep, k = 0, [], 0
    while k < len(body):
        ch = body[k]
        if f and depth == 0 and body[k:k+2] in ('{{','}}'): dep += [1,1]; k += 2; continue
        if f and ch == '{': depth += 1
        dep.append(depth)
        if f and ch == '}': depth -= 1
        k += 1
    best = None
    for j,ch in enumerate(body):
        if ch != ' ' or dep[j] or j < 8 or body[j-1] in ' \\' or j >= len(body) - 4: continue
        if len(pre) + 2 + j + 1 <= room: best = j
    if best is None: return None
    x, z = body[:best+1], body[best+1:]
    px = pre if (not f or '{' in x or '}' in x) else re.sub('[fF]', '', pre)
    pz = pre if (not f or '{' in z or '}' in z) else re.sub('[fF]', '', pre)
    return Atom(px + q + x + q, a.space, a.kind), Atom(pz + q + z + q, ' ', a.kind)

def emit(out, nodes, align, tail, breakable, tier=0):
    "Lay out `nodes` of one bracket level: as many segments on a line as fit, the rest at column `align`"
    segs = segments(nodes, tier) if breakable else [nodes]
    lim = out.lim
    opened = False
    for k, seg in enumerate(segs):
        t = tail if k == len(segs) - 1 else 0
        w = len(flat(seg, out.fresh))
        if opened and breakable and not out.fresh: out.newline(align)  # after a segment over several lines: a new line
        opened = False
        if out.col + w + t <= lim: out.put(flat(seg)); continue
        if breakable and not out.fresh:
            w1 = len(flat(seg, True))
            strings = any(isinstance(m, Atom) and m.kind == tokenize.STRING for m in seg)
            if align + w1 + t <= lim or lim - out.col < (lim - align)//3 or tier > 0 or strings:
                out.newline(align)
                if align + w1 + t <= lim: out.put(flat(seg)); continue
        n0 = len(out.lines)
        if breakable and tier < 2 and any(len(segments(seg, u)) > 1 for u in range(tier+1, 3)):
            emit(out, seg, align, t, True, tier+1)
        else: emit_open(out, seg, align, t, breakable)
        ends = [m for m in seg if not (isinstance(m, Atom) and m.text == ',')]
        opened = len(out.lines) > n0 and bool(ends) and isinstance(ends[-1], Group)

def emit_open(out, seg, align, tail, breakable):
    "Lay out a segment too long for its line: open its brackets, split its strings"
    lim = out.lim
    for k, n in enumerate(seg):
        rest = len(flat(seg[k+1:])) + tail
        if isinstance(n, Atom):
            later = [m for m in seg[k+1:] if isinstance(m, Group)]
            tight = len(flat(seg[k+1:seg.index(later[0])])) + 1 if later else rest
            while (breakable and n.kind == tokenize.STRING and out.col + len(n.space + n.text) + tight > lim):
                sp = _split_string(n, lim - out.col - (0 if out.fresh else len(n.space)))
                if sp is None: break
                out.put(sp[0].space + sp[0].text); out.newline(align); n = sp[1]
            out.put(n.space + n.text); continue
        w = len(flat([n], out.fresh))
        later = [m for m in seg[k+1:] if isinstance(m, Group)]
        upto = (len(flat(seg[k+1:seg.index(later[0])])) + len(later[0].open.space + later[0].open.text) if later
                else rest)
        if out.col + w + rest <= lim or (later and out.col + w + upto <= lim - 20) or not n.items:
            out.put(flat([n])); continue
        out.put(n.open.space + n.open.text)
        inner = out.col
        w0 = min(len(flat(segments(n.items, u)[0], True)) for u in range(3)) if n.items else 0
        if out.far and (inner > lim - out.far or inner + w0 > lim >= out.indent + 4 + w0):
            out.newline(out.indent + 4); inner = out.col  # far right: the contents go on the next line, indented by 4
        out.fresh = True
        close = n.close.space + n.close.text if n.close is not None else ''
        emit(out, n.items, inner, len(close) + rest, True)
        out.fresh = False
        out.put(close)

def layout(nodes, lead, depth, lim, far=44):
    "Lines for a statement (or a line inside brackets, `depth` deep) starting after `lead`"
    out = Out(lead, lim); out.far = far
    emit(out, nodes, len(lead), 0, depth > 0)
    return [l.rstrip() for l in out.lines]

# notebooks
def _is_export(cell):
    return cell['cell_type'] == 'code' and any(re.match(r'#\|\s*export', l) for l in cell['source'][:4])

def fix_notebook(path, limit=120, test_limit=140):
    "Re-wrap `path`'s export cells to `limit` (and its other code cells' lines over `test_limit`); the cells changed"
    path = Path(path); text = path.read_text(); nb = json.loads(text); changed = []
    for n, cell in enumerate(nb['cells']):
        if cell['cell_type'] != 'code': continue
        src = ''.join(cell['source'])
        new = Wrapper(src, limit, None if _is_export(cell) else test_limit).run()
        if new != src:
            cell['source'] = [l + '\n' for l in new.split('\n')]
            cell['source'][-1] = cell['source'][-1][:-1]
            if not cell['source'][-1]: cell['source'].pop()
            changed.append(n)
    if changed: path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return changed

def check(limit=120):
    "Lines over `limit` in each generated module: {module: [(line number, length)]}"
    res, total = {}, 0
    for p in sorted((ROOT/'fastprofile').rglob('*.py')):
        if p.name == '_modidx.py': continue
        ls = p.read_text().splitlines(); total += len(ls)
        res[str(p.relative_to(ROOT))] = [(k+1, len(l)) for k,l in enumerate(ls) if len(l) > limit]
    return res, total

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help='list generated lines over the limit, per module')
    ap.add_argument('--fix', nargs='+', metavar='NB', help='re-wrap these notebooks')
    ap.add_argument('--limit', type=int, default=120)
    ap.add_argument('-v', '--verbose', action='store_true', help='with --check: each line')
    a = ap.parse_args(argv)
    if a.fix:
        for nb in a.fix: print(f'{nb}: {len(fix_notebook(nb, a.limit))} cells re-wrapped')
    if a.check or not a.fix:
        res, total = check(a.limit)
        for mod, ls in res.items():
            if not ls: continue
            print(f'{mod}: {len(ls)} over {a.limit}')
            if a.verbose:
                src = (ROOT/mod).read_text().splitlines()
                for k, n in ls:  # what nbdev writes: the summary (`> ...`) as docstring, `__all__`
                    why = (' [the notebook\'s summary]' if k == 1 else ' [nbdev\'s __all__]'
                           if src[k-1].startswith('__all__') else '')
                    print(f'  {k}: ({n}){why} {src[k-1].strip()[:100]}')
        over = sum(len(v) for v in res.values())
        print(f'{over} of {total} lines over {a.limit} ({100*over/max(total,1):.1f}%)')
        return 0

if __name__ == '__main__': sys.exit(main())
