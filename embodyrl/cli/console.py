"""``embodyrl console RUN_DIR``: the operator console, its own process (:mod:`embodyrl.console`).

The web page binds to loopback by default. Every request needs the token
printed at start (``--no-token`` leaves it out, on loopback only) and must
name the console by a loopback name, an IP address or a ``--public-host``
name. Off loopback plain HTTP is refused unless TLS certificates are given
or ``--insecure`` is set (exit 2, as the learner refuses plain TCP). The control endpoint, which the learner and the actors
dial (``--console`` on ``train`` and ``actor``), follows the learner's rule:
CurveZMQ keys off loopback, or ``--insecure``. ``--admin-key`` with
``--admin-robot`` lets the console's e-stop latch as an admin's at the robot
servers named, and its clear lift one (:mod:`embodyrl.console.admin`).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from pathlib import Path

from ..hal.wire.security import is_loopback
from .security import SecurityOptionError, check_address, console_key_pairs, server_keys

CONSOLE_KEYS_HELP = ("the console's CurveZMQ keys: --secret-key FILE and --authorized-keys DIR (the actors' "
                     "and the learner's public keys), or --curve for the pairs embodyrl train --curve uses")


def add_console_option(parser: argparse.ArgumentParser) -> None:
    """``--console`` and ``--console-key`` of ``train`` and ``actor``."""
    group = parser.add_argument_group("operator console (embodyrl console RUN_DIR)")
    group.add_argument("--console", metavar="ENDPOINT",
                       help="dial the console's control endpoint, e.g. tcp://127.0.0.1:5590 (config: console)")
    group.add_argument("--console-key", metavar="FILE",
                       help="the console's public key: the link is CurveZMQ with this process's own "
                            "secret key (config: console_key)")


def _split_bind(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SecurityOptionError(f"--bind: expected HOST:PORT, got {bind!r}")
    return host.strip("[]"), int(port)


def options_of(args):
    """The :class:`~embodyrl.console.server.ConsoleOptions` of the command line; refusals name the option."""
    from ..console.server import ConsoleOptions

    run_dir = Path(args.run_dir)
    host, port = _split_bind(args.bind)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SecurityOptionError("--tls-cert and --tls-key go together")
    for option, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path and not Path(path).is_file():
            raise SecurityOptionError(f"{option}: no file {path}")
    local = is_loopback(f"tcp://{host}:{port}")
    if not local and not args.tls_cert and not args.insecure:
        raise SecurityOptionError(
            f"--bind: refusing plain HTTP on {host}:{port}: give --tls-cert and --tls-key or allow "
            "insecure links explicitly (--insecure)")
    if args.curve and (args.secret_key or args.authorized_keys):
        raise SecurityOptionError("--curve makes its own keys: leave out --secret-key and --authorized-keys")
    keys = console_key_pairs(run_dir / "keys") if args.curve else server_keys(args)
    check_address(args.control, keys, args.insecure, "--control")
    if args.no_token and (args.token or not local):
        raise SecurityOptionError("--no-token: only on loopback, and not with --token")
    token = None if args.no_token else args.token or secrets.token_urlsafe(24)
    return ConsoleOptions(run_dir, host, port, args.control, keys, token, public_hosts=tuple(args.public_host or ()),
                          tls_cert=args.tls_cert, tls_key=args.tls_key, admin=_admin(args))


def _admin(args):
    """The :class:`~embodyrl.console.admin.AdminKey` of ``--admin-key`` and ``--admin-robot`` (both or neither)."""
    from ..console.admin import AdminKey, parse_robot

    if args.admin_key is None and not args.admin_robot:
        return None
    if args.admin_key is None:
        raise SecurityOptionError("--admin-robot needs --admin-key: the admin's NAME.key_secret")
    if not args.admin_robot:
        raise SecurityOptionError("--admin-key needs the robot servers it may reach: --admin-robot "
                                  "ACTOR[:DEVICE]=ROBOT (a robot file, or ENDPOINT,SERVER_KEY_FILE)")
    try:
        robots = [parse_robot(text) for text in args.admin_robot]
    except ValueError as err:
        raise SecurityOptionError(f"--admin-robot: {err}") from None
    try:
        return AdminKey(args.admin_key, robots)
    except ValueError as err:
        raise SecurityOptionError(f"--admin-key: {err}") from None


def _console(args) -> int:
    from ..console.server import serve

    options = options_of(args)
    options.run_dir.mkdir(parents=True, exist_ok=True)

    def started(control: str, url: str) -> None:
        print(f"console: {url}", flush=True)
        print(f"control endpoint: {control} (embodyrl train/actor --console {control})", flush=True)
        if options.keys is not None:
            print(f"console public key: {options.keys.secret_key_file.with_suffix('.key')}", flush=True)
        for robot in options.admin.robots.values() if options.admin is not None else ():
            print(f"admin key {options.admin.secret_key.name} reaches {robot.name()}", flush=True)

    try:
        asyncio.run(serve(options, started))
    except KeyboardInterrupt:
        return 130
    return 0


def register(sub) -> None:
    c = sub.add_parser(
        "console", help="the operator console in the browser: watch every robot and the learner, act on them",
        description="Serve the operator console of RUN_DIR: live figures, curves and camera frames of the "
                    "learner and every actor that dials --control, and buttons to e-stop, pause, take "
                    "over and answer each robot. A finished run is shown from RUN_DIR/metrics.jsonl, and "
                    "every action is logged there. Exit codes: 0 stopped, 2 bad arguments or keys.")
    c.add_argument("run_dir", help="the run directory (its metrics.jsonl is read and appended to)")
    c.add_argument("--bind", default="127.0.0.1:8765", metavar="HOST:PORT",
                   help="where the page is served (default 127.0.0.1:8765); off loopback plain HTTP "
                        "needs --insecure")
    c.add_argument("--control", default="tcp://127.0.0.1:5590", metavar="ENDPOINT",
                   help="the control endpoint the learner and actors dial (default tcp://127.0.0.1:5590)")
    c.add_argument("--token", help="the token to require (default: a random one, printed at start)")
    c.add_argument("--no-token", action="store_true",
                   help="require no token: a trusted desk, on loopback only")
    c.add_argument("--public-host", action="append", metavar="NAME",
                   help="a host name the page is reached by besides loopback names and IP addresses "
                        "(repeatable); any other Host is refused, which defeats DNS rebinding")
    c.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    c.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    group = c.add_argument_group("security", CONSOLE_KEYS_HELP)
    group.add_argument("--secret-key", metavar="FILE", help="the console's NAME.key_secret")
    group.add_argument("--authorized-keys", metavar="DIR", help="public .key files of the peers to admit")
    group.add_argument("--curve", action="store_true",
                       help="use (and make, if missing) the key pairs in RUN_DIR/keys that train --curve uses")
    group.add_argument("--insecure", action="store_true",
                       help="allow plain HTTP and plain TCP off loopback (anyone who reaches the ports can act)")
    admin = c.add_argument_group(
        "admin e-stop", "with an admin key the console's e-stop latches at the robot servers named as an admin's, "
                        "which the actor cannot lift, and its clear lifts one (the robot server's --admin-keys)")
    admin.add_argument("--admin-key", metavar="FILE",
                       help="an admin's NAME.key_secret (embodyrl keys DIR NAME); its NAME.key is in the robot "
                            "servers' --admin-keys")
    admin.add_argument("--admin-robot", action="append", metavar="ACTOR[:DEVICE]=ROBOT",
                       help="the robot server of actor ACTOR's device DEVICE (default 0), the only ones the admin "
                            "key reaches: a robot file (its device.endpoint and device.keys.server_key) or "
                            "ENDPOINT,SERVER_KEY_FILE (repeatable)")
    c.set_defaults(func=_console)
