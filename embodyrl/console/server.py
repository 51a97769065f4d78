"""Run the console: the control endpoint and the web server in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..hal.wire.security import ServerKeys
from .admin import AdminKey
from .app import MAX_BODY_BYTES, create_app
from .control import ActionLog, ControlServer
from .state import ConsoleState

BINDINGS_FILE = "console_key_bindings.json"
"""In the run directory, with keys: the actor id each key took (the learner's are ``key_bindings.json``)."""


@dataclass(frozen=True)
class ConsoleOptions:
    run_dir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    control: str = "tcp://127.0.0.1:5590"
    keys: ServerKeys | None = None
    token: str | None = None
    """Required of every web request when set (always set, unless ``--no-token`` on loopback)."""
    public_hosts: tuple[str, ...] = ()
    """Host names the page may be reached by besides loopback names and IP addresses."""
    tls_cert: str | None = None
    tls_key: str | None = None
    admin: AdminKey | None = None
    """The admin key and the robot servers it reaches (``--admin-key``, ``--admin-robot``)."""


async def serve(options: ConsoleOptions, started=lambda control, url: None) -> None:
    """Serve until stopped (SIGINT/SIGTERM); ``started(control endpoint, page URL)`` once listening."""
    import uvicorn

    state = ConsoleState(options.run_dir)
    state.load_metrics()
    control = ControlServer(state, options.control, options.keys, ActionLog(options.run_dir),
                            bindings_path=options.run_dir / BINDINGS_FILE, admin=options.admin)
    receiving = asyncio.create_task(control.run())
    app = create_app(control, options.token, (options.host, *options.public_hosts))
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning",
                            ssl_certfile=options.tls_cert, ssl_keyfile=options.tls_key,
                            ws="websockets-sansio" if _has_sansio() else "auto", lifespan="off",
                            ws_max_size=MAX_BODY_BYTES)  # the page sends nothing over its WebSocket
    web = uvicorn.Server(config)
    scheme = "https" if options.tls_cert else "http"
    query = f"?token={options.token}" if options.token else ""

    async def announce() -> None:
        while not web.started:
            await asyncio.sleep(0.02)
        started(control.endpoint, f"{scheme}://{options.host}:{options.port}/{query}")

    announcing = asyncio.create_task(announce())
    try:
        await web.serve()
    finally:
        for task in (announcing, receiving):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        control.close()


def _has_sansio() -> bool:
    try:
        import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401
    except ImportError:
        return False
    return True
