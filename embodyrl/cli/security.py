"""CurveZMQ options of ``embodyrl learner``, ``actor`` and ``train``.

The rule the wire enforces (:mod:`embodyrl.hal.wire.security`): plain TCP
only on loopback. Leaving the machine takes keys (``embodyrl keys``) or an
explicit ``--insecure``. The checks here run before any process starts or
any JAX import, so a mistake costs a second and exits with code 2, naming
the option at fault.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..hal.wire.security import (
    ClientKeys,
    SecurityError,
    ServerKeys,
    check_endpoint,
    generate_keys,
    load_keys,
)

INSECURE_HELP = ("allow plain TCP on a non-loopback address: anyone who reaches the port can send "
                 "experience and read the weights (default: refused without keys)")


class SecurityOptionError(ValueError):
    """A security option is missing, contradicts another, or names a bad key file."""


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


def _key_file(path: str, option: str, secret: bool) -> Path:
    try:
        _, secret_key = load_keys(path)
    except SecurityError as err:
        raise SecurityOptionError(f"{option}: {err}") from None
    if secret and secret_key is None:
        raise SecurityOptionError(f"{option}: {path} holds no secret key (give NAME.key_secret, not NAME.key)")
    return Path(path)


def server_keys(args) -> ServerKeys | None:
    """The learner's keys from ``--secret-key``/``--authorized-keys`` (both or neither)."""
    if args.secret_key is None and args.authorized_keys is None:
        return None
    if args.secret_key is None or args.authorized_keys is None:
        given, missing = (("--secret-key", "--authorized-keys") if args.secret_key
                          else ("--authorized-keys", "--secret-key"))
        raise SecurityOptionError(f"{given} needs {missing} too")
    directory = Path(args.authorized_keys)
    if not directory.is_dir():
        raise SecurityOptionError(f"--authorized-keys: no directory {directory}")
    if not any(directory.glob("*.key")):
        raise SecurityOptionError(f"--authorized-keys: {directory} holds no public .key file")
    return ServerKeys(_key_file(args.secret_key, "--secret-key", secret=True), directory)


def client_keys(args) -> ClientKeys | None:
    """The actor's keys from ``--secret-key``/``--server-key`` (both or neither)."""
    if args.secret_key is None and args.server_key is None:
        return None
    if args.secret_key is None or args.server_key is None:
        given, missing = (("--secret-key", "--server-key") if args.secret_key
                          else ("--server-key", "--secret-key"))
        raise SecurityOptionError(f"{given} needs {missing} too")
    return ClientKeys(_key_file(args.secret_key, "--secret-key", secret=True),
                      _key_file(args.server_key, "--server-key", secret=False))


def check_address(endpoint: str, keys, insecure: bool, option: str) -> None:
    """Refuse plain TCP off this machine unless ``--insecure``, naming the option."""
    try:
        check_endpoint(endpoint, keys is not None, insecure)
    except SecurityError as err:
        raise SecurityOptionError(f"{option}: {err} (--insecure)") from None


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
