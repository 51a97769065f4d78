"""``embodyrl relay``: one weight stream from the learner to a host or rack, served to the actors there
(:mod:`embodyrl.transport.relay`). The actors dial the relay's --bind as they would the learner."""

from __future__ import annotations

import argparse
import json
import sys

from .security import INSECURE_HELP


def register(sub) -> None:
    r = sub.add_parser(
        "relay", help="take each weight publication once for the actors of this host or rack",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Relay between the learner at --connect and the actors that dial --bind: their steps, "
                    "acks and credits pass through on a connection of each actor's own; each weight "
                    "publication comes from the learner once and goes to every actor under the learner's "
                    "rules (the newest once it holds the last, a delta against its own version, the "
                    "checksum). Prints one JSON line {\"endpoint\": ...} once it listens.",
        epilog="keys: --secret-key is the relay's; with --authorized-keys (the actors' public keys) it "
               "admits only those, with --server-key (the learner's public key) it dials the learner "
               "with CurveZMQ; list the relay's actors' indices under its key in the learner's "
               "authorised indices.json\nexit codes: 0 the learner ended the run or a signal stopped it, "
               "1 no learner answered, 2 bad arguments or keys")
    r.add_argument("--connect", required=True, metavar="ENDPOINT", help="the learner's endpoint")
    r.add_argument("--bind", default="tcp://127.0.0.1:*", help="where actors dial it (default %(default)s)")
    r.add_argument("--name", default="relay", help="its name, in the learner's sessions (default %(default)s)")
    r.add_argument("--index", type=int, default=0,
                   help="its index among the learner's relays: its own session's id is -2 - INDEX (default 0)")
    r.add_argument("--peer-timeout-s", type=float, default=30.0,
                   help="an actor silent this long is dropped (default %(default)s)")
    r.add_argument("--handshake-timeout-s", type=float, default=60.0,
                   help="how long to wait for the learner's first answer (default %(default)s)")
    group = r.add_argument_group("security (CurveZMQ; keys from: embodyrl keys DIR NAME)")
    group.add_argument("--secret-key", metavar="FILE", help="the relay's NAME.key_secret")
    group.add_argument("--authorized-keys", metavar="DIR", help="the public keys of the actors to admit")
    group.add_argument("--server-key", metavar="FILE", help="the learner's public NAME.key")
    group.add_argument("--insecure", action="store_true", help=INSECURE_HELP)
    r.set_defaults(func=_relay)


def _relay(args) -> int:
    from ..hal.wire.client import LinkError
    from ..hal.wire.security import client_keys, server_keys
    from ..transport.relay import Relay
    from .processes import stop_on_signals
    from .security import check_address

    downstream = server_keys(args) if args.authorized_keys else None
    upstream = client_keys(args) if args.server_key else None
    check_address(args.bind, downstream, args.insecure, "--bind")
    check_address(args.connect, upstream, args.insecure, "--connect")
    should_stop = stop_on_signals()
    relay = Relay(args.connect, args.bind, name=args.name, index=args.index, keys=downstream,
                  learner_keys=upstream, allow_insecure=args.insecure, peer_timeout_s=args.peer_timeout_s,
                  handshake_timeout_s=args.handshake_timeout_s)
    try:
        try:
            relay.connect()
        except LinkError as err:
            print(f"embodyrl: relay: {err}", file=sys.stderr)
            return 1
        print(json.dumps({"endpoint": relay.endpoint, "learner": args.connect}), flush=True)
        relay.run(should_stop)
        relay.drain(1.0)  # the learner's goodbyes on their way to the actors
        print(json.dumps(relay.metrics()), flush=True)
    finally:
        relay.close()
    return 0
