"""The page as text, the way the web-crm-v1 agent reads it: one walk of the live DOM (run
in the page by `WALK_JS`) that numbers every interactive element (`[7] textbox "Amount"
value="1200"`) and writes the rest as headings, table rows and paragraphs, then
`render`, which puts the address, title, alerts and flash messages first and shows a
window of at most `max_lines` body lines that the `scroll` action moves.

The walk tags each numbered element with `data-rldojo-ref` and stamps the document with
the observation's number, so an action can tell a ref of the latest observation (found)
from one of an older page (the stamp differs: stale). Accessible names come, in order,
from aria-labelledby, aria-label, <label> (for= or wrapping), the text, title and
placeholder — the subset of the ARIA name computation that server-rendered forms use.

Beside the walk, the other scripts the session runs in the page (where a click leads, the
click itself, `window.open` disarmed) and `outside_kind`, which says whether a URL they
report is on the episode's origin or which kind of refusal it falls under.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CLICK_JS",
    "CLICK_TARGET_JS",
    "NO_WINDOW_OPEN_JS",
    "REF_ATTR",
    "SCHEME_KINDS",
    "WALK_JS",
    "PageText",
    "origin_of",
    "outside_kind",
    "render",
    "window_start",
]

REF_ATTR = "data-rldojo-ref"
"""The attribute that carries an element's number from the latest observation."""

MAX_OPTIONS = 25
"""Options of a select listed in full; longer lists end with a count (still selectable)."""

MAX_VALUE_CHARS = 300
"""A field's value is cut here in the text (a long textarea would swamp the page)."""

WALK_JS = r"""
([gen, maxOptions, maxValue]) => {
  const REF = 'data-rldojo-ref';
  document.querySelectorAll('[' + REF + ']').forEach(e => e.removeAttribute(REF));
  window.__rldojoObs = gen;
  const refs = [], lines = [], alerts = [], statuses = [];
  const BLOCK = new Set(['ADDRESS','ARTICLE','ASIDE','BLOCKQUOTE','BODY','DD','DETAILS','DIV',
    'DL','DT','FIELDSET','FIGCAPTION','FIGURE','FOOTER','FORM','HEADER','HR','LEGEND','MAIN',
    'NAV','OL','P','PRE','SECTION','SUMMARY','TABLE','TBODY','THEAD','TFOOT','UL','CAPTION']);
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','svg','IFRAME','OBJECT']);
  const squash = s => (s || '').replace(/\s+/g, ' ').trim();
  const q = s => JSON.stringify(s);
  const cut = s => s.length > maxValue ? s.slice(0, maxValue) + '…' : s;
  const textOf = el => squash(el.innerText || el.textContent);
  const labelText = label => {
    const c = label.cloneNode(true);
    c.querySelectorAll('input,select,textarea,button').forEach(x => x.remove());
    return squash(c.textContent);
  };
  const nameOf = el => {
    const by = el.getAttribute('aria-labelledby');
    if (by) { const t = by.split(/\s+/).map(i => document.getElementById(i))
      .filter(Boolean).map(textOf).join(' '); if (t) return t; }
    const aria = squash(el.getAttribute('aria-label')); if (aria) return aria;
    const tag = el.tagName, type = (el.getAttribute('type') || '').toLowerCase();
    if (tag === 'INPUT' && ['submit','button','reset'].includes(type))
      return el.value || (type === 'reset' ? 'Reset' : 'Submit');
    if (tag === 'INPUT' && type === 'image') return el.alt || 'Submit';
    if (el.labels && el.labels.length) {
      const t = [...el.labels].map(labelText).join(' '); if (t) return t; }
    if (!['INPUT','SELECT','TEXTAREA'].includes(tag)) {
      const t = textOf(el); if (t) return t;
      const img = el.querySelector('img[alt]'); if (img && img.alt) return squash(img.alt); }
    return squash(el.getAttribute('title') || el.getAttribute('placeholder') || '');
  };
  const roleOf = el => {
    const tag = el.tagName, type = (el.getAttribute('type') || 'text').toLowerCase();
    const role = el.getAttribute('role');
    if (tag === 'A' && el.hasAttribute('href')) return 'link';
    if (tag === 'BUTTON') return 'button';
    if (tag === 'SELECT') return 'combobox';
    if (tag === 'TEXTAREA') return 'textbox';
    if (tag === 'INPUT') {
      if (type === 'hidden' || type === 'file') return null;
      if (['submit','button','reset','image'].includes(type)) return 'button';
      if (type === 'checkbox' || type === 'radio') return type;
      return 'textbox'; }
    if (['button','link','checkbox','radio'].includes(role)) return role;
    return null;
  };
  const describe = (el, role) => {
    const n = refs.length + 1; el.setAttribute(REF, String(n)); refs.push([n, role]);
    let s = `[${n}] ${role} ${q(nameOf(el))}`;
    const type = (el.getAttribute('type') || 'text').toLowerCase();
    if (role === 'textbox') {
      if (el.tagName === 'INPUT' && !['text','search'].includes(type)) s += ` type=${type}`;
      if (el.value) s += ` value=${q(cut(type === 'password' ? '•••' : el.value))}`; }
    if (role === 'checkbox' || role === 'radio')
      s += (el.checked || el.getAttribute('aria-checked') === 'true') ? ' checked' : ' unchecked';
    if (role === 'combobox') {
      const opts = [...el.options].map(o => squash(o.label || o.text) || o.value);
      const sel = el.selectedIndex >= 0 ? opts[el.selectedIndex] : '';
      s += ` value=${q(sel)} options: ` + opts.slice(0, maxOptions).join(', ');
      if (opts.length > maxOptions) s += ` … (${opts.length - maxOptions} more)`; }
    if (el.disabled) s += ' disabled';
    if (el.required) s += ' required';
    if (el.readOnly && role === 'textbox') s += ' readonly';
    return s;
  };
  const hidden = el => el.getAttribute('aria-hidden') === 'true' || el.hidden ||
    (el.checkVisibility && !el.checkVisibility({visibilityProperty: true}));
  // A sink gathers one line at a time; an inline sink (a table cell) never breaks.
  const sink = (inline) => ({ cur: '', out: [], inline,
    add(t) { this.cur += t; },
    brk(prefix) { const t = squash(this.cur); if (this.inline) { this.cur += ' '; return; }
      if (t) this.out.push((prefix || '') + t); this.cur = ''; } });
  const inlineText = (el) => { const s = sink(true); kids(el, s); return squash(s.cur); };
  const kids = (el, s) => { for (const c of el.childNodes) walk(c, s); };
  const walk = (node, s) => {
    if (node.nodeType === Node.TEXT_NODE) { s.add(node.textContent.replace(/\s+/g, ' ')); return; }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const el = node, tag = el.tagName;
    if (SKIP.has(tag) || hidden(el)) return;
    const live = el.getAttribute('role');
    if (live === 'alert' || live === 'status') {
      const t = inlineText(el); if (t) (live === 'alert' ? alerts : statuses).push(t); return; }
    const role = roleOf(el);
    if (role === 'link' || role === 'button') { s.add(' ' + describe(el, role) + ' '); return; }
    if (role) { s.brk(); s.add(describe(el, role)); s.brk(); return; }  // a field: a line
    if (tag === 'LABEL' && el.control) {
      if (el.contains(el.control)) walk(el.control, s); return; }
    if (/^H[1-6]$/.test(tag)) { s.brk(); const t = inlineText(el);
      if (t) { s.add('#'.repeat(+tag[1]) + ' ' + t); } s.brk(); return; }
    if (tag === 'TR') { s.brk(); const cells = [...el.children]
        .filter(c => !hidden(c)).map(inlineText);
      if (cells.some(Boolean)) s.add('| ' + cells.join(' | ') + ' |'); s.brk(); return; }
    if (tag === 'LI') { s.brk(); s.add('- '); kids(el, s); s.brk(); return; }
    if (tag === 'BR') { s.brk(); return; }
    if (tag === 'IMG') { if (el.alt) s.add(' ' + el.alt + ' '); return; }
    const block = BLOCK.has(tag);
    if (block) s.brk();
    kids(el, s);
    if (block) s.brk();
  };
  const body = sink(false);
  if (document.body) walk(document.body, body);
  body.brk();
  return {title: squash(document.title), alerts, statuses, lines: body.out, refs};
}
"""
"""Walks the page once: numbers the interactive elements, returns `PageText`'s fields."""


CLICK_TARGET_JS = r"""
([ref, gen]) => {
  const el = document.querySelector(`[data-rldojo-ref="${ref}"]`);
  if (window.__rldojoObs !== gen || !el) return {stale: true};
  const info = {disabled: !!el.disabled, options: [...(el.options || [])]
    .map(o => [(o.label || o.text).replace(/\s+/g, ' ').trim(), o.value])};
  const a = el.closest('a[href]');
  if (a) return {...info, url: a.href, target: a.target, download: a.hasAttribute('download')};
  const type = (el.getAttribute('type') || '').toLowerCase();
  const submits = el.tagName === 'BUTTON' ? ['', 'submit'].includes(type)
    : el.tagName === 'INPUT' && ['submit', 'image'].includes(type);
  if (el.form && submits) {
    const action = el.getAttribute('formaction') ?? el.form.getAttribute('action') ?? '';
    return {...info, url: new URL(action, document.baseURI).href, download: false,
      target: el.getAttribute('formtarget') ?? el.form.getAttribute('target') ?? ''};
  }
  return info;
}
"""
"""Checks a ref against the latest observation and tells where clicking it would lead."""

CLICK_JS = r"""
([ref, gen]) => {
  const el = document.querySelector(`[data-rldojo-ref="${ref}"]`);
  if (window.__rldojoObs !== gen || !el) return {stale: true};
  let navigates = false, submit = null;
  const seen = e => { navigates = navigates || !e.defaultPrevented; };
  const sent = e => { submit = e; };
  const opened = window.__rldojoOpened || 0;
  navigation.addEventListener('navigate', seen);
  window.addEventListener('submit', sent, true);
  try { el.click(); } finally {
    navigation.removeEventListener('navigate', seen);
    window.removeEventListener('submit', sent, true); }
  if (submit && !submit.defaultPrevented) {
    const method = (submit.submitter && submit.submitter.getAttribute('formmethod')) ||
      submit.target.getAttribute('method') || '';
    navigates = navigates || method.toLowerCase() !== 'dialog'; }
  return {navigates, opened: (window.__rldojoOpened || 0) - opened};
}
"""
"""Clicks the element numbered `ref` by the DOM's `click()` (the link followed, the form
validated and submitted, the box toggled) and tells whether that started a navigation of
the page, and how often it called `window.open`. Not Playwright's mouse click, which
spends ~70 ms before a navigation starts (the element held still over animation frames,
frame-aligned mouse events) on what the caller checked already: the ref is fresh,
rendered and enabled (`CLICK_TARGET_JS`), its link or form on the origin and in this
window. A link's navigation fires the Navigation API's `navigate` event (Chromium 102+)
during the click; a form's starts a task later, so a submission not cancelled (and not a
dialog's) counts."""

NO_WINDOW_OPEN_JS = """
window.open = function () {
  window.__rldojoOpened = (window.__rldojoOpened || 0) + 1;
  return null;
};
"""
"""Run before each document's scripts: `window.open` opens nothing and is counted, so a
click that tried is refused when the click returns (a real popup is only seen later)."""


SCHEME_KINDS = {"file": "file", "data": "data", "chrome": "chrome", "javascript": "javascript"}
"""Refusal kinds named after the scheme; other hosts are `host`, other schemes `scheme`,
and `popup`, `download` count windows and files refused."""


def origin_of(url: str) -> str:
    """`scheme://host:port` of an http(s) URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) origin: {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def outside_kind(url: str, origin: str) -> str | None:
    """None for a URL on `origin`, else the refusal kind it falls under."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        with contextlib.suppress(ValueError):
            if origin_of(url) == origin:
                return None
        return "host"
    return SCHEME_KINDS.get(scheme, "scheme")


@dataclass
class PageText:
    """One observation of the page: its title, alert and status messages, body lines and
    the numbered elements with their roles (`{7: "textbox"}`)."""

    url: str
    title: str
    alerts: list[str]
    statuses: list[str]
    lines: list[str]
    roles: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_walk(cls, url: str, walked: dict[str, Any]) -> PageText:
        """Build from what `WALK_JS` returned for the page at `url`."""
        return cls(
            url=url,
            title=str(walked.get("title", "")),
            alerts=[str(a) for a in walked.get("alerts", [])],
            statuses=[str(s) for s in walked.get("statuses", [])],
            lines=[str(line) for line in walked.get("lines", [])],
            roles={int(n): str(role) for n, role in walked.get("refs", [])},
        )


def window_start(top: int, total: int, max_lines: int, direction: str) -> int:
    """The first body line shown after scrolling `direction` from `top`: a window moves by
    all but two of its lines, so a row cut at the edge is seen whole on one side."""
    step = max(1, max_lines - 2)
    if direction == "down":
        return max(0, min(top + step, total - max_lines))
    return max(0, top - step)


def render(page: PageText, top: int, max_lines: int) -> str:
    """The observation text: `Page: <path> — <title>`, then `Alert:`/`Status:` lines, then
    body lines `top`..`top+max_lines` with a note for the lines above and below."""
    parts = urlsplit(page.url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = [f"Page: {path}" + (f" — {page.title}" if page.title else "")]
    head += [f"Alert: {a}" for a in page.alerts] + [f"Status: {s}" for s in page.statuses]
    total = len(page.lines)
    top = max(0, min(top, max(0, total - max_lines)))
    shown = page.lines[top : top + max_lines]
    body = []
    if top > 0:
        body.append(f"(… {top} lines above: scroll up)")
    body += shown
    below = total - top - len(shown)
    if below > 0:
        body.append(f"(… {below} more lines: scroll down)")
    return "\n".join([*head, "", *body])
