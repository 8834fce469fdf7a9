"""web-crm-v1: the CRM twin as a server-rendered web application, operated through a real
headless Chromium in text (an accessibility tree with numbered element references).

`app` / `pages`: the web application over one episode's CRM database; `server`: the
loopback server that hosts one application per episode (a cookie picks the episode);
`browser`: the pool of Chromium contexts, the page as text and the actions.
"""
