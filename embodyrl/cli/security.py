"""CurveZMQ options of ``embodyrl learner``, ``actor`` and ``train``.

The rule the wire enforces (:mod:`embodyrl.hal.wire.security`): plain TCP
only on loopback. Leaving the machine takes keys (``embodyrl keys``) or an
explicit ``--insecure``. The checks (``server_keys``, ``client_keys``,
``check_address``: the edge's own, which the robot server uses too) run
before any process starts or any JAX import, so a mistake costs a second
and exits with code 2, naming the option at fault.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..hal.wire.security import (  # noqa: F401 - the option checks are the edge's, named here too
    ClientKeys,
    SecurityOptionError,
    ServerKeys,
    check_address,
    client_keys,
    generate_keys,
    server_keys,
)

INSECURE_HELP = ("allow plain TCP on a non-loopback address: anyone who reaches the port can send "
                 "experience and read the weights (default: refused without keys)")


def add_learner_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (CurveZMQ; keys from: embodyrl keys DIR NAME)")
    group.add_argument("--secret-key", metavar="FILE",
                       help="this learner's NAME.key_secret; with --authorized-keys, encrypts and "
                            "authenticates every actor")
    group.add_argument("--authorized-keys", metavar="DIR",
                       help="directory of the public NAME.key files of the actors to admit")
    group.add_argument("--insecure", action="store_true", help=INSECURE_HELP)


def add_actor_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (CurveZMQ; keys from: embodyrl keys DIR NAME)")
    group.add_argument("--secret-key", metavar="FILE", help="this actor's NAME.key_secret")
    group.add_argument("--server-key", metavar="FILE", help="the learner's public NAME.key")
    group.add_argument("--insecure", action="store_true", help=INSECURE_HELP)


def add_train_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security")
    group.add_argument("--curve", action="store_true",
                       help="secure the learner-actor link with CurveZMQ: fresh key pairs in RUN_DIR/keys")
    group.add_argument("--insecure", action="store_true",
                       help="allow a non-loopback --learner.bind without --curve")


def local_key_pairs(directory: Path) -> tuple[ServerKeys, ClientKeys]:
    """A learner and an actor key pair under ``directory`` (made once, reused on resume)."""
    directory = Path(directory)
    learner_public = directory / "learner" / "learner.key"
    actor_public = directory / "actor" / "actor.key"
    if not learner_public.exists():
        generate_keys(directory / "learner", "learner")
    if not actor_public.exists():
        generate_keys(directory / "actor", "actor")
    authorized = directory / "authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(actor_public, authorized / "actor.key")
    return (ServerKeys(directory / "learner" / "learner.key_secret", authorized),
            ClientKeys(directory / "actor" / "actor.key_secret", learner_public))


def console_key_pairs(directory: Path) -> ServerKeys:
    """The console's keys under ``directory`` beside the learner's and the actor's of
    :func:`local_key_pairs` (all made once, reused): it admits the learner and the actor."""
    directory = Path(directory)
    local_key_pairs(directory)
    if not (directory / "console" / "console.key").exists():
        generate_keys(directory / "console", "console")
    authorized = directory / "console_authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    for name in ("learner", "actor"):
        shutil.copyfile(directory / name / f"{name}.key", authorized / f"{name}.key")
    return ServerKeys(directory / "console" / "console.key_secret", authorized)
