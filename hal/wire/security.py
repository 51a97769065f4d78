"""CurveZMQ keys: encryption and authentication for links that leave the machine.

``embodyrl keys DIR NAME`` writes ``NAME.key`` (public, share it) and
``NAME.key_secret`` (keep it). The learner holds its secret key and a
directory of the public keys of the actors it accepts; an actor holds its own
secret key and the learner's public key. A peer without an authorised key
never completes the handshake. Plain TCP is refused on anything but loopback
unless explicitly allowed.

:class:`RateLimiter` caps what peers without a session may cost a server:
token buckets per peer (key or connection), one for everyone, and a small
reserve for HELLOs, checked before a message is decoded.

:func:`server_keys`, :func:`client_keys` and :func:`check_address` read and
check the key options of a command (the robot server's, ``embodyrl``'s),
raising :class:`SecurityOptionError` that names the option at fault.

:class:`HandshakeWatch` reads a client socket's monitor while it waits for its first answer:
the causes ZeroMQ makes certain end the wait at once, the others are named in one line
after :data:`HINT_AFTER_S` of silence.
"""

from __future__ import annotations

import contextlib
import ipaddress
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message


class SecurityError(RuntimeError):
    pass


def generate_keys(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write a key pair; returns (public key file, secret key file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(directory), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def load_keys(path: str | Path) -> tuple[bytes, bytes | None]:
    """(public, secret) from a key file; secret is None for a public-only file."""
    path = Path(path)
    if not path.exists():
        raise SecurityError(f"key file {path} does not exist")
    try:
        return zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as err:
        raise SecurityError(f"{path} is not a CurveZMQ key file: {err}") from None


def is_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` stays on this machine (ipc, inproc, or a loopback address)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or an interface name: not known to be local


@dataclass(frozen=True)
class ServerKeys:
    secret_key_file: Path
    """The learner's ``.key_secret`` file."""
    authorized_dir: Path
    """A directory of the public ``.key`` files of accepted actors."""


@dataclass(frozen=True)
class ClientKeys:
    secret_key_file: Path
    """This actor's ``.key_secret`` file."""
    server_key_file: Path
    """The learner's public ``.key`` file."""


def check_endpoint(endpoint: str, secured: bool, allow_insecure: bool) -> None:
    if not secured and not allow_insecure and not is_loopback(endpoint):
        raise SecurityError(
            f"refusing plain TCP on {endpoint}: give CurveZMQ keys (embodyrl keys) or allow insecure links explicitly")


class SecurityOptionError(ValueError):
    """A security option is missing, contradicts another, or names a bad key file (a command exits 2)."""


def key_file(path: str, option: str, secret: bool) -> Path:
    """``path`` once checked to hold a CurveZMQ key (a secret one where ``secret``), errors naming ``option``."""
    try:
        _, secret_key = load_keys(path)
    except SecurityError as err:
        raise SecurityOptionError(f"{option}: {err}") from None
    if secret and secret_key is None:
        raise SecurityOptionError(f"{option}: {path} holds no secret key (give NAME.key_secret, not NAME.key)")
    return Path(path)


def _both(first, second, options: tuple[str, str]) -> bool:
    """Whether a pair of options that go together is given (both: True, neither: False)."""
    if first is None and second is None:
        return False
    if first is None or second is None:
        given, missing = options if first else options[::-1]
        raise SecurityOptionError(f"{given} needs {missing} too")
    return True


def server_keys(args) -> ServerKeys | None:
    """A server's keys from the options ``--secret-key``/``--authorized-keys`` (both or neither)."""
    if not _both(args.secret_key, args.authorized_keys, ("--secret-key", "--authorized-keys")):
        return None
    directory = Path(args.authorized_keys)
    if not directory.is_dir():
        raise SecurityOptionError(f"--authorized-keys: no directory {directory}")
    if not any(directory.glob("*.key")):
        raise SecurityOptionError(f"--authorized-keys: {directory} holds no public .key file")
    return ServerKeys(key_file(args.secret_key, "--secret-key", secret=True), directory)


def client_keys(args) -> ClientKeys | None:
    """A client's keys from the options ``--secret-key``/``--server-key`` (both or neither)."""
    if not _both(args.secret_key, args.server_key, ("--secret-key", "--server-key")):
        return None
    return ClientKeys(key_file(args.secret_key, "--secret-key", secret=True),
                      key_file(args.server_key, "--server-key", secret=False))


def check_address(endpoint: str, keys, insecure: bool, option: str) -> None:
    """:func:`check_endpoint` for a command's option: plain TCP off this machine only with ``--insecure``."""
    try:
        check_endpoint(endpoint, keys is not None, insecure)
    except SecurityError as err:
        raise SecurityOptionError(f"{option}: {err} (--insecure)") from None


def public_keys(directory: str | Path) -> dict[str, str]:
    """Every public key in ``directory``: z85 key -> its file's name without ``.key``.

    The name is how the rest of the system speaks of a key (which actor
    indices it may use, whether it is an admin's)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SecurityError(f"authorised keys directory {directory} does not exist")
    found = {}
    for path in sorted(directory.glob("*.key")):
        public, _ = load_keys(path)
        found[public.decode("ascii")] = path.stem
    return found


def peer_key(frame) -> str | None:
    """The CurveZMQ public key (z85) a received frame was sent with; None on a plain socket.

    ZeroMQ sets it from the handshake, so unlike anything in the message it
    cannot be forged by the peer."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:  # not a CURVE socket
        return None
    return user or None


RESCAN_S = 1.0
"""Shortest interval between two reads of the authorised-keys directories on an unknown key."""


class _KeySet:
    """A ZAP credentials provider: admits exactly the keys in its directories. An unknown key
    re-reads them (at most once per :data:`RESCAN_S`), so a key added while the server runs (an
    actor that joined through a rendezvous record) is admitted without a restart, and a peer
    knocking with unknown keys costs at most one directory read a second."""

    def __init__(self, directories: tuple[Path, ...]):
        self.directories = directories
        self._read_at = float("-inf")
        self.keys = self._read()

    def _read(self) -> set[bytes]:
        self._read_at = time.monotonic()
        keys = set()
        for directory in self.directories:
            keys |= {key.encode("ascii") for key in public_keys(directory)}
        return keys

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        if time.monotonic() - self._read_at >= RESCAN_S:
            with contextlib.suppress(SecurityError):  # the directory went away: keep the keys read last
                self.keys = self._read()
        return key in self.keys


def secure_server(socket: zmq.Socket, keys: ServerKeys, *extra_dirs: str | Path,
                  context: zmq.Context | None = None) -> ThreadAuthenticator:
    """Make ``socket`` a CURVE server that admits only the authorised keys
    (those in ``keys.authorized_dir`` and in any of ``extra_dirs``, e.g. admins').

    Call before ``bind``; stop the returned authenticator when closing. ``context``: the plain
    context an asyncio socket's context shadows (the authenticator's thread needs a plain one).
    """
    public, secret = load_keys(keys.secret_key_file)
    if secret is None:
        raise SecurityError(f"{keys.secret_key_file} holds no secret key")
    allowed = _KeySet(tuple(Path(d) for d in (keys.authorized_dir, *extra_dirs)))
    auth = ThreadAuthenticator(context or socket.context)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=allowed)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    return auth


class ServerSocket:
    """A ROUTER bound at ``bind``, secured with CurveZMQ when ``keys`` are given, and everything
    closing it releases: the socket, its authenticator, and the context it made.

    CurveZMQ's ZAP handler is one per context, so a secured server makes its own context unless
    one is given (a given one is left open). ``options``: socket options set before binding.
    ``asyncio``: a ``zmq.asyncio`` socket, on a shadow of its own plain context (the
    authenticator's thread needs the plain one). ``extra_dirs``: more directories of admitted keys.
    """

    def __init__(self, bind: str, keys: ServerKeys | None = None, *extra_dirs: str | Path,
                 context: zmq.Context | None = None, options: dict[int, int] | None = None,
                 asyncio: bool = False):
        self._own_context = context is None and (keys is not None or asyncio)
        self._context = context or (zmq.Context() if self._own_context else zmq.Context.instance())
        if asyncio:
            from zmq.asyncio import Context as AsyncContext

            self.socket = AsyncContext.shadow(self._context).socket(zmq.ROUTER)
        else:
            self.socket = self._context.socket(zmq.ROUTER)
        self._auth: ThreadAuthenticator | None = None
        try:
            self.socket.setsockopt(zmq.LINGER, 0)
            for option, value in (options or {}).items():
                self.socket.setsockopt(option, value)
            if keys is not None:
                self._auth = secure_server(self.socket, keys, *extra_dirs, context=self._context)
            self.socket.bind(bind)
        except BaseException:
            self.close()
            raise
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self) -> None:
        """Idempotent: the socket, then the authenticator, then the context it made."""
        if not self.socket.closed:
            self.socket.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_context:
            self._context.term()
            self._own_context = False


def secure_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``socket`` a CURVE client of the server whose public key is given. Call before connect."""
    public, secret = load_keys(keys.secret_key_file)
    if secret is None:
        raise SecurityError(f"{keys.secret_key_file} holds no secret key")
    server_public, _ = load_keys(keys.server_key_file)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public


HINT_AFTER_S = 5.0
"""How long a client waits for its first answer before it says, once, what is likely wrong."""
HANDSHAKE_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
"""The monitor events :meth:`HandshakeWatch.read` wants (``socket.get_monitor_socket(HANDSHAKE_EVENTS)``)."""


def say_on_stderr(line: str) -> None:
    print(f"embodyrl: {line}", file=sys.stderr, flush=True)


class HandshakeWatch:
    """Why a client's first answer does not come, from its socket's monitor (:data:`HANDSHAKE_EVENTS`).

    What libzmq 4.3 tells the client, by experiment (``tests/test_no_silent_hang.py``):

    * our key not authorised (the server's ZAP handler says 400): ``HANDSHAKE_FAILED_AUTH``, and
      ZeroMQ does not dial again;
    * no keys against a keyed server, or keys against a plain one: ``HANDSHAKE_FAILED_PROTOCOL``
      (mechanism mismatch);
    * a server key that is not the server's: the server drops the handshake without a word,
      ``HANDSHAKE_FAILED_NO_DETAIL`` on each of ZeroMQ's reconnects (so, on a busy machine, may
      no keys against a keyed server: the drop can come before the mechanism's mismatch is read);
    * nothing listening: no ``CONNECTED`` at all, only retries.

    The first two are certain at once, the third once two handshakes in a row are dropped
    (:attr:`failure`). Nothing listening (a server may start yet) and a server that takes the
    connection but never answers are known only by silence: :meth:`waiting` says, once, after
    ``hint_after_s``, one line naming the likely causes, through ``say``.
    """

    def __init__(self, endpoint: str, keys: ClientKeys | None, deadline_s: float, *,
                 hint_after_s: float = HINT_AFTER_S, say: Callable[[str], None] | None = None,
                 server: str = "the server"):
        self.endpoint, self.keys, self.server = endpoint, keys, server
        self.deadline_s, self.hint_after_s = deadline_s, hint_after_s
        self.say = say or say_on_stderr
        self.started = time.monotonic()
        self.reached = False
        """Whether a TCP connection was made at all (nothing listening: never)."""
        self.dropped = 0
        """Handshakes in a row the server dropped without a word."""
        self.failure: str | None = None
        """The certain cause, once there is one."""
        self.hinted = False

    def read(self, monitor: zmq.Socket) -> list[int]:
        """Note every event waiting on ``monitor``; return them (the caller may want more of them)."""
        events = []
        while True:
            try:
                message = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return events
            events.append(message["event"])
            self.note(message["event"], int(message["value"]))

    def note(self, event: int, value: int) -> None:
        if event == zmq.EVENT_CONNECTED:
            self.reached = True
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.dropped = 0
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.failure = (f"{self.server} refused our CurveZMQ key (ZAP status {value}): our key is not "
                            f"authorised there; add our public key {self._public()} to its authorised keys")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value != zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                self.failure = f"the handshake with {self.server} failed (ZeroMQ protocol error {value:#x})"
            elif self.keys is not None:
                self.failure = (f"{self.server} speaks plain TCP and we dialled with CurveZMQ keys: "
                                "give it keys too, or drop ours")
            else:
                self.failure = (f"{self.server} wants CurveZMQ keys and we dialled without: give us our "
                                "secret key and its public key")
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.dropped += 1
            if self.dropped >= 2:
                self.failure = (f"{self.server} dropped the CurveZMQ handshake twice: the server key we hold "
                                f"({self.keys.server_key_file}) is not its key" if self.keys is not None else
                                f"{self.server} dropped our handshake twice: it likely wants CurveZMQ keys and we "
                                "dialled without (give us our secret key and its public key), or it is not a server "
                                "of ours")

    def waiting(self) -> None:
        """Say the likely causes, once, when nothing answered for ``hint_after_s``."""
        waited = time.monotonic() - self.started
        if not self.hinted and waited >= self.hint_after_s:
            self.hinted = True
            self.say(f"no answer from {self.endpoint} after {waited:.0f} s (still trying for "
                     f"{max(self.deadline_s - waited, 0):.0f} s): {self.causes()}")

    def causes(self) -> str:
        """The likely causes of silence, in one phrase."""
        seen = "no connection was ever made" if not self.reached else "connected, but no answer"
        keyed = ("our key not authorised there, the wrong server key, keys against a plain server"
                 if self.keys is not None else "plain TCP against a server that wants keys")
        return f"{seen}; likely nothing listening at that address (is {self.server} running?), or {keyed}"

    def _public(self) -> str:
        secret = self.keys.secret_key_file if self.keys is not None else None
        return str(secret.with_suffix(".key")) if secret is not None and secret.suffix == ".key_secret" else "NAME.key"


@dataclass(frozen=True)
class RateLimits:
    """Requests per second a server answers from peers that hold no session (see :class:`RateLimiter`)."""

    per_key_per_s: float = 20.0
    """Each peer: its CurveZMQ key, or without keys its connection (a ZeroMQ identity)."""
    per_key_burst: float = 20.0
    global_per_s: float = 100.0
    """All sessionless peers together (not the session owner's key: it has only its own bucket)."""
    global_burst: float = 100.0
    hello_per_s: float = 5.0
    """HELLOs the shared bucket has no token for: a reserve that no flood of anything else can spend."""
    hello_burst: float = 5.0


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up; ``take`` spends one."""

    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, capacity: float, now: float):
        if not rate > 0 or not capacity >= 1:
            raise ValueError(f"need rate > 0 and capacity >= 1, got {rate}, {capacity}")
        self.rate, self.capacity, self.tokens, self.stamp = rate, capacity, capacity, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class RateLimiter:
    """Token buckets for peers without a session, checked before a message is decoded.

    A message spends, in order: its peer's own bucket (a CURVE key, or a connection's identity where
    that is all there is), then the shared bucket of all sessionless peers. Two exceptions keep a
    flood from locking out the robot's own actor:

    * ``owner``: the session owner's key, from a connection that is not the session's (a restarted
      actor resuming), spends only its own bucket, never the shared one.
    * ``hello``: a HELLO the shared bucket refuses may spend the HELLO reserve instead. Without keys a
      restarted actor is a new connection like any flooder's, but it sends a few HELLOs, not a
      stream: a flood of STATUS or junk spends the shared bucket and never touches the reserve, so
      the actor's first HELLO gets in. Each connection still spends its own bucket first.

    :meth:`allow` names the bucket that let a message in, or returns None. A flood of HELLOs from
    ever new connections does spend the reserve; without keys nothing tells them from an actor
    (and such a peer can take over a silent session anyway): keys are the answer to that.

    Authenticated keys are a bounded set; connection identities are not, so past ``max_keys`` the
    oldest peer's bucket is forgotten (the shared caps still hold)."""

    def __init__(self, limits: RateLimits, now: float, max_keys: int = 4096):
        self.limits = limits
        self.max_keys = max_keys
        self._global = TokenBucket(limits.global_per_s, limits.global_burst, now)
        self._hello = TokenBucket(limits.hello_per_s, limits.hello_burst, now)
        self._keys: dict[str | bytes, TokenBucket] = {}

    def allow(self, peer: str | bytes | None, now: float, *, owner: bool = False, hello: bool = False) -> str | None:
        """``"owner"``, ``"global"`` or ``"hello"``: the bucket that let the message in; None: drop it.
        ``peer`` None (nothing known of it) spends no bucket of its own."""
        if peer is not None:
            bucket = self._keys.get(peer)
            if bucket is None:
                if len(self._keys) >= self.max_keys:
                    del self._keys[next(iter(self._keys))]  # the oldest peer's
                bucket = self._keys[peer] = TokenBucket(self.limits.per_key_per_s, self.limits.per_key_burst, now)
            if not bucket.take(now):
                return None
        if owner:
            return "owner"
        if self._global.take(now):
            return "global"
        if hello and self._hello.take(now):
            return "hello"
        return None
