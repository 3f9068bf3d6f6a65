# SPDX-License-Identifier: Apache-2.0
"""The one way jitterscope makes HTTP requests (urllib): the notification
targets (streams/notify.py), the kubelet client (collector/kubelet.py), and
the front door talking to its own streams worker (cli/query.py,
cli/up.py).

- **Redirects are refused, never followed.** A request can carry a bearer
  token (webhook, kubelet, the worker's /query token), and urllib would resend
  it to wherever a 3xx points: another port, another host. Every 3xx raises
  ``RedirectRefused`` (an ``urllib.error.HTTPError``, so an ``OSError``), which
  callers count as a failure like any other HTTP error.
- **Proxies.** ``proxies=False`` goes direct whatever ``http_proxy`` says
  (for addresses that are always local or in-cluster: the worker, the node's
  kubelet); with ``proxies=True`` (the default) the environment's proxies
  apply, except to loopback addresses, which are always reached directly (a
  proxy would see the request's token, and cannot reach our loopback anyway).
"""

from __future__ import annotations

import ipaddress
import ssl
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from jitterscope.common.masking import mask_url


class RedirectRefused(urllib.error.HTTPError):
    """A 3xx answer: refused, the request is not sent again elsewhere."""


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise RedirectRefused(req.full_url, code, f"redirect to {mask_url(newurl)} refused ({msg})", headers, fp)


def is_loopback(host: str | None) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (a host name, no port)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _DirectToLoopback(urllib.request.ProxyHandler):
    """The environment's proxies, except for loopback addresses."""

    def proxy_open(self, req, proxy, type):
        if is_loopback(urlsplit(req.full_url).hostname):
            return None  # the next handler (plain HTTP/HTTPS) connects directly
        return super().proxy_open(req, proxy, type)


def opener(*, proxies: bool = True, tls: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """A urllib opener that refuses redirects; use its ``.open(request, timeout=...)``
    where ``urllib.request.urlopen`` would be used. ``tls``: the context for https."""
    handlers: list[urllib.request.BaseHandler] = [
        _RefuseRedirects(), _DirectToLoopback() if proxies else urllib.request.ProxyHandler({})]
    if tls is not None:
        handlers.append(urllib.request.HTTPSHandler(context=tls))
    return urllib.request.build_opener(*handlers)
