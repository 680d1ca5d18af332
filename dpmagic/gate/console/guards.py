"""What refuses a forged change: a page of another site that makes the owner's
browser post a grant to the console.

Three checks, each enough against today's browsers, kept together so that one
missing in some browser or proxy does not open the door:

- the session cookie is ``SameSite=Strict``: a browser does not send it with a
  request another site started (``server.py`` sets it);
- every POST must carry the session's own CSRF token in a hidden field, which a
  page of another site cannot read (compared in constant time);
- a POST's ``Origin`` (or, where a browser sends none, its ``Referer``) must name
  the host the request was sent to. The host is the request's ``Host`` header,
  which the browser sets to the console's address, or the Hub's behind its proxy.

GET never changes anything, so only POSTs are checked.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from dpmagic.gate.console.sessions import Session

CSRF_FIELD = "_csrf"


def same_origin(origin: str | None, referer: str | None, host: str) -> bool:
    """Whether a POST comes from a page of the console's own host. A request that
    names no origin at all is refused: every browser names one on a form's POST."""
    source = origin if origin is not None else referer
    if not source or source == "null":
        return False
    return urlsplit(source).netloc.lower() == host.lower()


def csrf_ok(session: Session | None, offered: str | None) -> bool:
    """Whether ``offered`` is ``session``'s CSRF token."""
    if session is None or not offered:
        return False
    return hmac.compare_digest(offered.encode(), session.csrf.encode())
