"""The hub's proxy: configurable-http-proxy's Python port, passing responses on as they come.

    c.ConfigurableHTTPProxy.command = [sys.executable, "-m", "parlab.hub.proxy"]

The Python port (PyPI `configurable-http-proxy` 0.4, which `make hub` installs) reads a whole
response before it sends any of it, with tornado's default 20 s limit. A response that streams
never arrives: the spawn page's progress (JupyterHub's event stream of a starting server) is
cut after 20 s with a 503, so a learner whose server waits, a Slurm job in the queue above all,
sees an empty bar and never the wait or the reason. npm's configurable-http-proxy streams. So
does this: the same proxy, with each response's status and headers passed on as they arrive
and its body chunk by chunk (tornado's header_callback and streaming_callback), and no time
limit on a response unless --proxy-timeout gives one.
"""

from __future__ import annotations

from typing import Any

from configurable_http_proxy import cli, handlers
from tornado.httpclient import AsyncHTTPClient

__all__ = ["call_proxy", "main"]

DROPPED = ("content-length", "transfer-encoding", "content-encoding", "connection")
NO_LIMIT = 7 * 24 * 3600.0   # seconds: tornado has no "never"


async def call_proxy(self: Any, path: str | None = None) -> None:
    """ProxyHandler.call_proxy, streaming (see the module's docstring)."""
    url = await self.get_target_url(path)
    if url is None:
        return
    req = self._get_proxy_request(url)
    preset = {h[0].lower() for h in self._headers.get_all()}  # Server, Content-Type, Date
    started = [False]

    def header(line: str) -> None:
        if line.startswith("HTTP/"):
            _, code, *reason = line.strip().split(" ", 2)
            self.set_status(int(code), reason[0] if reason else None)
            started[0] = True
        elif ":" in line:
            name, value = (part.strip() for part in line.split(":", 1))
            if name.lower() in DROPPED:
                return
            (self.set_header if name.lower() in preset else self.add_header)(name, value)

    def chunk(data: bytes) -> None:
        self.write(data)
        self.flush()

    req.header_callback, req.streaming_callback = header, chunk
    req.request_timeout = self.proxy.proxy_timeout or NO_LIMIT
    try:
        response = await AsyncHTTPClient().fetch(req, raise_error=False)
    except Exception as err:
        if not started[0]:
            await self.handle_proxy_error(503, err)
        return
    if response.code == 599 and not started[0]:     # no answer at all from the target
        await self.handle_proxy_error(503, response.error)
        return
    self.finish()


def main() -> None:
    handlers.ProxyHandler.call_proxy = call_proxy
    cli.main()


if __name__ == "__main__":
    main()
