"""A small server-rendered site for the web-crm-v1 browser tests, in the shape of the real
application (no JavaScript but for one trap; forms, links, tables, role="alert" errors,
role="status" flashes, the `rldojo_episode` cookie) without depending on it. It records
every request it gets (`hits`) and every form posted to it (`posts`), so a test can prove
what the browser fetched.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

STAGES = ["prospecting", "qualification", "proposal", "negotiation", "closed won"]
DEALS = [
    (f"DEAL-{i:04d}", f"Account {i} renewal", STAGES[i % 5], 1000 + 100 * i) for i in range(1, 11)
]


@dataclass
class Site:
    """The app and what it saw."""

    app: FastAPI
    hits: list[str] = field(default_factory=list)
    posts: list[dict[str, str]] = field(default_factory=list)


def _page(title: str, body: str, flash: str = "", error: str = "") -> HTMLResponse:
    alert = f'<div role="alert">{html.escape(error)}</div>' if error else ""
    status = f'<p role="status">{html.escape(flash)}</p>' if flash else ""
    nav = '<nav><a href="/">Deals</a> <a href="/traps">Traps</a> <a href="/long">Long</a></nav>'
    return HTMLResponse(
        f"<!doctype html><html><head><title>{title}</title><style>.gone{{display:none}}"
        f"</style></head><body>{nav}{alert}{status}<main>{body}</main></body></html>"
    )


def _deals(request: Request) -> HTMLResponse:
    rows = "".join(
        f'<tr><td><a href="/deals/{i}">{d}</a></td><td>{name}</td><td>{stage}</td></tr>'
        for i, (d, name, stage, _) in enumerate(DEALS, 1)
    )
    episode = request.cookies.get("rldojo_episode", "none")
    body = (
        f"<h1>Deals</h1><p>Episode {html.escape(episode)}. Ten open deals.</p>"
        f"<table><thead><tr><th>ID</th><th>Name</th><th>Stage</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        '<p class="gone">hidden text</p><input type="hidden" name="csrf" value="x">'
        '<a href="/?page=2">Next</a>'
    )
    return _page("Deals", body, flash="Deal saved" if request.query_params.get("saved") else "")


def _deal_form(i: int, error: str = "") -> HTMLResponse:
    deal, _, stage, amount = DEALS[i - 1]
    options = "".join(
        f'<option value="{s}"{" selected" if s == stage else ""}>{s.title()}</option>'
        for s in STAGES
    )
    body = (
        f"<h1>{deal}</h1><h2>Edit</h2><form method=post action='/deals/{i}'>"
        f'<label for="amount">Amount</label><input id="amount" name="amount" type="number" '
        f'value="{amount}"><label>Stage <select name="stage">{options}</select></label>'
        '<input type="checkbox" id="won" name="won" value="yes"><label for="won">Won</label>'
        '<textarea name="notes" aria-label="Notes" placeholder="Notes"></textarea>'
        '<input name="owner" placeholder="Owner email" type="email">'
        "<button>Save</button> <button type=submit disabled>Archive</button></form>"
    )
    return _page(deal, body, error=error)


TRAPS = """<h1>Traps</h1><ul>
<li><a href="http://example.invalid/">other host</a></li>
<li><a href="file:///etc/passwd">a file</a></li>
<li><a href="data:text/html,<h1>hi</h1>">data</a></li>
<li><a href="chrome://version">chrome</a></li>
<li><a href="javascript:location.href='/stolen'">script</a></li>
<li><a href="/popup-target" target="_blank">new tab</a></li>
<li><button type="button" onclick="window.open('/opened')">open window</button></li>
<li><a href="/export.csv" download>export</a></li>
<li><a href="/attachment">attachment</a></li>
<li><a href="/away">redirect away</a></li>
</ul><form method="post" action="http://example.invalid/steal"><button>Send away</button></form>"""


def make_site() -> Site:
    """The fixture site; serve `site.app` (e.g. with `rldojo.asgi.start_in_thread`)."""
    app = FastAPI()
    site = Site(app)

    @app.middleware("http")
    async def record(request: Request, call_next):  # type: ignore[no-untyped-def]
        site.hits.append(request.url.path)
        return await call_next(request)

    app.get("/", response_class=HTMLResponse)(_deals)

    @app.get("/deals/{i}", response_class=HTMLResponse)
    def deal(i: int) -> HTMLResponse:
        return _deal_form(i)

    @app.post("/deals/{i}")
    async def save(i: int, request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        site.posts.append(form)
        if not form.get("amount", "").isdigit():
            return _deal_form(i, error="Amount must be a whole number")
        return RedirectResponse("/?saved=1", status_code=303)

    app.get("/traps", response_class=HTMLResponse)(lambda: _page("Traps", TRAPS))
    pixel = '<h1>Image</h1><img src="http://example.invalid/pixel.png" alt="a pixel">'
    app.get("/image", response_class=HTMLResponse)(lambda: _page("Image", pixel))
    long = "".join(f"<p>Line {n} of the long page.</p>" for n in range(1, 201))
    app.get("/long", response_class=HTMLResponse)(lambda: _page("Long", long))
    app.get("/attachment")(
        lambda: Response("a,b\n", media_type="text/csv",
                         headers={"Content-Disposition": "attachment; filename=x.csv"})
    )  # fmt: skip
    app.get("/away")(lambda: RedirectResponse("http://example.invalid/landing"))
    return site
