"""The console's web face: the page, its live state over a WebSocket, camera frames, actions.

Routes::

    GET  /              the page (static/index.html)     GET /static/...   its files
    WS   /ws            the state, pushed 4 times a second
    GET  /api/state     the same state, once
    GET  /frame         the newest JPEG of one camera (?actor=&device=&field=)
    POST /api/action    {"action", "actor", "device", "value"} -> the action's outcome

Every request must name this console in its Host header: a loopback name,
an IP address, or a name given with ``--public-host`` (else 403), so a
DNS-rebinding page cannot reach it under its own name. With a token (the
default; ``--no-token`` leaves it out on loopback) every request must carry
it: the ``token`` query parameter, an ``Authorization: Bearer`` header, or
the cookie the page gets when opened with the token. A refused request gets
401 (a WebSocket is closed with code 4401). Requests from another origin are
refused (403), so no other web page the operator has open can act through
their browser. An action must be JSON of at most :data:`MAX_BODY_BYTES`
(413, unread past that); a malformed one is answered 400.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
from pathlib import Path
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from .control import BadAction, ControlServer

STATIC = Path(__file__).parent / "static"
COOKIE = "embodyrl_console_token"
PUSH_EVERY_S = 0.25
MAX_BODY_BYTES = 64 << 10
"""An action's JSON body, at most."""
LOOPBACK_NAMES = frozenset({"localhost"})


def _authorised(connection: HTTPConnection, token: str | None) -> bool:
    if token is None:
        return True
    given = connection.query_params.get("token") or connection.cookies.get(COOKIE) or ""
    header = connection.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        given = header[7:].strip()
    return secrets.compare_digest(given.encode(), token.encode())


def _host_allowed(connection: HTTPConnection, names: frozenset[str]) -> bool:
    """The Host header names this console: a loopback name, an IP address (no rebinding forges
    one), or one of ``names``."""
    try:
        host = urlsplit("//" + connection.headers.get("host", "")).hostname
    except ValueError:
        return False
    if not host:
        return False
    if host in LOOPBACK_NAMES or host in names:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _body(request: Request) -> bytes | None:
    """The request's body, or None once it is over :data:`MAX_BODY_BYTES` (read no further)."""
    length = request.headers.get("content-length", "")
    if length and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


def _same_origin(connection: HTTPConnection) -> bool:
    """No Origin (not a browser's cross-site request), or one naming this very host."""
    origin = connection.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == connection.headers.get("host")


def _origin(connection: HTTPConnection) -> str:
    client = connection.client
    return f"browser {client.host}" if client is not None else "browser"


def create_app(server: ControlServer, token: str | None = None, hosts: tuple[str, ...] = ()) -> Starlette:
    """The app around a running :class:`ControlServer`; ``token``: required of every request;
    ``hosts``: names the page may be reached by besides loopback names and IP addresses."""
    state = server.state
    names = frozenset(h.lower().strip("[]") for h in hosts)
    latest = {"json": json.dumps(state.snapshot()), "at": 0.0}

    def snapshot_json() -> str:
        now = asyncio.get_running_loop().time()
        if now - latest["at"] >= PUSH_EVERY_S / 2:  # one snapshot per push, however many pages watch
            latest["json"], latest["at"] = json.dumps(state.snapshot()), now
        return latest["json"]

    def refused(request: Request) -> Response | None:
        if not _host_allowed(request, names):
            return JSONResponse({"error": "this console is not served under that host name (--public-host NAME "
                                          "admits one)"}, status_code=403)
        if not _authorised(request, token):
            return JSONResponse({"error": "not authorised: open the URL with the token the console printed"},
                                status_code=401)
        if not _same_origin(request):
            return JSONResponse({"error": "cross-origin request refused"}, status_code=403)
        return None

    async def index(request: Request) -> Response:
        if (answer := refused(request)) is not None:
            return answer
        response = FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})
        if token is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response

    async def api_state(request: Request) -> Response:
        if (answer := refused(request)) is not None:
            return answer
        return Response(snapshot_json(), media_type="application/json")

    async def frame(request: Request) -> Response:
        if (answer := refused(request)) is not None:
            return answer
        try:
            actor, device = int(request.query_params["actor"]), int(request.query_params["device"])
            name = request.query_params["field"]
        except (KeyError, ValueError):
            return JSONResponse({"error": "give actor, device and field"}, status_code=400)
        peer = state.actors.get(actor)
        image = peer.frames.get((device, name)) if peer is not None else None
        if image is None:
            return JSONResponse({"error": f"no frame of actor {actor} device {device} {name!r} yet"},
                                status_code=404)
        return Response(image.jpeg, media_type="image/jpeg",
                        headers={"Cache-Control": "no-store", "X-Frame-Seq": str(image.seq)})

    async def action(request: Request) -> Response:
        if (answer := refused(request)) is not None:
            return answer
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"error": "an action is a JSON body (Content-Type: application/json)"},
                                status_code=415)
        raw = await _body(request)
        if raw is None:
            return JSONResponse({"error": f"an action is at most {MAX_BODY_BYTES} bytes"}, status_code=413,
                                headers={"Connection": "close"})
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return JSONResponse({"error": "the body is not JSON (or is nested too deep)"}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("action"), str):
            return JSONResponse({"error": "give {\"action\": ..., \"actor\": ..., \"device\": ...}"},
                                status_code=400)
        try:
            entry = await server.act(body["action"], body.get("actor"), body.get("device"), body.get("value"),
                                     origin=_origin(request))
        except BadAction as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({"id": entry.id, "status": entry.status, "error": entry.error,
                             "received_at": entry.received, "results": entry.results})

    async def live(websocket: WebSocket) -> None:
        if not _host_allowed(websocket, names):
            await websocket.close(code=4403, reason="host")  # before accepting: an HTTP 403
            return
        await websocket.accept()
        if not _authorised(websocket, token):
            await websocket.close(code=4401, reason="not authorised")
            return
        if not _same_origin(websocket):
            await websocket.close(code=4403, reason="cross-origin")
            return
        try:
            while True:
                await websocket.send_text(snapshot_json())
                await asyncio.sleep(PUSH_EVERY_S)
        except (WebSocketDisconnect, RuntimeError):
            return

    return Starlette(routes=[
        Route("/", index), Route("/api/state", api_state), Route("/frame", frame),
        Route("/api/action", action, methods=["POST"]), WebSocketRoute("/ws", live),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ])
