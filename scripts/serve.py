"""See it happen: a page on this machine that writes past the window and shows the cache sliding.

One page, three views (the page's files are mvgpt/live/static/; the data behind them mvgpt/live/views.py):
- Write: the story streamed token by token, beside each model's cache: the rows it holds, its
  position against its length, each slide, and the window a model with learned positions runs
  again past it; ms per token as a live line, with the running median.
- Read past the window: a held-out piece of three windows, each token coloured by its loss under
  context.py's sliding window, sliding cache and full context.
- Rotary angles: a pair's arrow turning with the position, the speeds of all 32 pairs, and what
  linear, NTK and YaRN scaling do to them at a chosen n_ctx.
Standard library server, plain HTML/JS/SVG: nothing is fetched from the network, only the page's
own files are served, and it listens on 127.0.0.1 unless --host says otherwise. Its first line says
which one-token step writes each model's tokens (--decode-step: the C step where its build pays, as
sample.py chooses it, by default).

Examples:
    python scripts/serve.py checkpoints/pretrain-rope checkpoints/pretrain     # then open the address
    python scripts/serve.py checkpoints/pretrain-rope --port 8080
    python scripts/serve.py checkpoints/lora-rope checkpoints/pretrain-rope   # a LoRA run, on its base, beside it
    python scripts/serve.py /tmp/tiny --data-dir /tmp/tinydata --device cpu --port 0   # tiny; any free port
    python scripts/serve.py checkpoints/pretrain-rope --decode-step model   # model.py's step, as the video wrote it
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import errno
import ipaddress
import json
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from pathlib import Path
from urllib.parse import parse_qs

import numpy as np
from context import LOSS_METHODS

from mvgpt.checkpoint import CHECKPOINT_NAME, find_model, load_source, model_arg
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data, windows
from mvgpt.device import pick_device
from mvgpt.kit.errors import ArgumentParser, UserError, number, run_main
from mvgpt.live import views as live
from mvgpt.live.views import Limits, LiveError, sse
from mvgpt.model import GPT
from mvgpt.perf.fast_decode import add_decode_step_arg, use_decode_step
from mvgpt.tokenizer import Tokenizer

STATIC = Path(live.__file__).with_name("static")  # the page: index.html, live.js, live.css
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# A Host header: a name or an IPv4 address, or an IPv6 address in brackets; then maybe a port (RFC 9110).
HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[\w.~-]+)?)\]|(?P<name>[\w.~!$&'()*+,;=%-]+))(?::(?P<port>\d{0,5}))?",
                  re.ASCII)
# A page that stops reading (a frozen tab, a client that never reads) fills its connection's send buffer,
# and the next write waits: with the models held, every other page waits too. A page that is there
# takes each event as it comes, so no write waits long: one that waits this long has no reader. The
# same bound applies to a connection that opens and sends no request (a browser's preconnect, say).
SEND_TIMEOUT = 20.0  # seconds
# a page asking for more keeps a model for hours (~100 tokens/s): a bound the operator can read
MAX_TOKENS = number(int, lambda v: 1 <= v <= 100_000, "a whole number from 1 to 100,000")
# The page loads its own files and nothing else: a CDN link slipped in would fail here too, not only offline.
port_number = number(int, lambda v: 0 <= v <= 65535, "a whole number from 0 to 65535")
SECURITY = {"Content-Security-Policy": "default-src 'self'", "X-Content-Type-Options": "nosniff"}
WAITING = "stopping: the models finish the step they are on first"


@dataclass
class Live:
    """What the server holds: the models, the tokenizer, the held-out tokens, and who is using them."""

    models: dict[str, GPT]
    tokenizer: Tokenizer
    val: np.ndarray | None  # held-out tokens, for the read view
    limits: Limits = field(default_factory=Limits)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one request at a time runs the models
    stopping: threading.Event = field(default_factory=threading.Event)
    runs: list[dict] = field(default_factory=list)  # each write as it went: tokens sent, why it stopped
    scored: dict[tuple[str, int], list[dict]] = field(default_factory=dict)  # read view, per (model, piece)
    decoding: str = ""  # which one-token step each model decodes with (--decode-step): the first line said

    def info(self) -> dict:
        """What the page needs to build its forms."""
        models = [{"name": name, "rope": m.config.rope, "window": m.context, "capacity": 2 * m.context,
                   "params": m.num_params(), "layers": m.config.n_layer, "heads": m.config.n_head,
                   "embd": m.config.n_embd, "pairs": m.config.head_size // 2 if m.config.rope else 0,
                   "pieces": self.pieces(m)} for name, m in self.models.items()]
        return {"models": models, "limits": asdict(self.limits), "vocab": self.tokenizer.vocab_size}

    def pieces(self, model: GPT) -> int:
        """Held-out pieces of three windows there are to read."""
        return 0 if self.val is None else len(self.val) // (3 * model.config.block_size)


class ClientLeft(Exception):
    """The page closed its stream (a tab closed, Stop pressed): stop the work it asked for."""


class ServerStopping(Exception):
    """Ctrl-C: streams end at their next token."""


class Handler(BaseHTTPRequestHandler):
    server_version = "mvgpt-live"
    timeout = SEND_TIMEOUT  # put on the connection by socketserver: every read and write of it has this bound
    answered = False  # a status line has gone out: a failure after it can only end the answer

    @property
    def app(self) -> Live:
        return self.server.app

    def log_message(self, format: str, *args) -> None:
        pass  # the terminal gets one line, the address; the page shows what happens

    def send_response(self, code: int, message: str | None = None) -> None:
        # http.server takes a request line without a version for HTTP/0.9 and answers it with a bare
        # body: every answer here has its status line, a refusal included
        self.request_version = "HTTP/1.0" if self.request_version == "HTTP/0.9" else self.request_version
        self.answered = True
        super().send_response(code, message)

    def parse_request(self) -> bool:
        # a request line without a version (HTTP/0.9, "GET /") would have http.server wait for headers that
        # never come, the connection's whole timeout: refuse it at once
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if len(self.requestline.split()) == 2:
            self.request_version, self.command = "HTTP/1.0", None
            self.send_error(HTTPStatus.BAD_REQUEST,
                            "a request line without its HTTP version is not served: ask with HTTP/1.1")
            return False
        return super().parse_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line or header, one too long, a method other
        than GET) as one line of JSON, like every other answer: its HTML page would echo the request."""
        extra = {}
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:  # a method it has no do_ for: not allowed here
            code, message, extra = HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not served: ask with GET", {
                "Allow": "GET"}
        self.close_connection = True
        self.send_bytes(json.dumps({"error": message or HTTPStatus(code).phrase}).encode(), "application/json",
                        code, extra)

    def do_GET(self) -> None:
        try:
            try:
                self.answer()
            except LiveError as e:
                self.send_json({"error": str(e)}, 400)
        except ClientLeft:
            self.close_connection = True
        except Exception as e:  # a bug, or a model failing outside a stream: one line for the page, no traceback
            self.close_connection = True
            if not self.answered:
                with suppress(ClientLeft):
                    self.send_json({"error": failure("the request", e)}, 500)

    def answer(self) -> None:
        """Who may ask first (nothing is read or run for a request refused), then the route."""
        refused = self.refusal()
        if refused:
            return self.send_json({"error": refused[1]}, refused[0])
        path, _, query_text = self.path.partition("?")  # the target as sent: nothing in it names a file
        if not path.startswith("/"):
            raise LiveError(f"the request's target must be a path, such as /api/info, not {path[:80]!r}")
        query = parse_qs(query_text, keep_blank_values=True)
        routes = {"/api/info": self.info, "/api/write": self.write, "/api/read": self.read,
                  "/api/angles": self.angles}
        if path in routes:
            return routes[path](query)
        return self.send_page_file(path)

    def refusal(self) -> tuple[int, str] | None:
        """(status, message) for a request this server does not answer, else None. A server listening on
        loopback answers to this machine's own names only: a web page elsewhere could point its own name
        at 127.0.0.1 (DNS rebinding), and its script would then read this server as its own site; the
        browser still sends that site's name as the Host header."""
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            return 400, f"{len(hosts)} Host headers: send one"
        name = None
        if hosts and hosts[0].strip():
            try:
                name = host_name(hosts[0])
            except LiveError as e:
                return 400, str(e)
        if self.server.local_only and not (name == "localhost" or (name is not None and is_loopback(name))):
            return 403, f"this server answers to localhost only: open {url(self.server)} on this machine"
        return None

    # --- plain answers ---------------------------------------------------------------------------

    def send_page_file(self, path: str) -> None:
        """One of the page's own files, looked up by name: no path from a request touches the disk."""
        files = {"/" + f.name: f for f in STATIC.iterdir() if f.is_file()}
        file = files.get("/index.html" if path == "/" else path)
        if file is None:
            return self.send_json({"error": f"no such page: {path}"}, 404)
        self.send_bytes(file.read_bytes(), TYPES.get(file.suffix, "application/octet-stream"))

    def send_json(self, data: object, status: int = 200) -> None:
        self.send_bytes(json.dumps(data).encode(), "application/json", status)

    def send_bytes(self, body: bytes, content_type: str, status: int = 200, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**SECURITY, **(extra or {})}.items():
            self.send_header(name, value)
        with self.writing():
            self.end_headers()
            if self.command != "HEAD":  # HEAD is refused, and a HEAD's answer has no body
                self.wfile.write(body)

    def info(self, query: dict) -> None:
        self.send_json(self.app.info())

    def angles(self, query: dict) -> None:
        name = one_model(query, self.app)
        config = self.app.models[name].config
        if not config.rope:
            raise LiveError(f"{name} has learned positions: it has no rotary angles (choose a rope model)")
        W, limits = config.block_size, self.app.limits
        ctx = live.field(query, "ctx", int, W, limits.ctx_factor * W, 4 * W)
        pair = live.field(query, "pair", int, 0, config.head_size // 2 - 1, 0)
        self.send_json(live.angles_view(config, ctx, pair))

    # --- streams ---------------------------------------------------------------------------------

    @contextmanager
    def stream(self, doing: str, run: dict | None = None) -> Iterator[None]:
        """An event stream's answer, and its end whatever happens inside: `done` (sent inside), the page
        gone, the server stopping, or a failure (a NaN weight, say), which ends it with an `error` event
        of one line that the page shows. By then the models are released (models_held is inside) and
        the server goes on; the terminal gets nothing."""
        run = {} if run is None else run
        self.start_stream()
        try:
            yield
        except ClientLeft as e:
            run["stopped"] = str(e) or "the page left"
        except ServerStopping:
            run["stopped"] = "the server is stopping"
            self.last_word("the server is stopping: start it again to go on")
        except Exception as e:
            run["stopped"] = message = failure(doing, e)
            self.last_word(message)

    def last_word(self, message: str) -> None:
        with suppress(ClientLeft):  # a page that has gone is not told
            self.send_event("error", {"message": message})

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        for name, value in SECURITY.items():
            self.send_header(name, value)
        with self.writing():
            self.end_headers()

    def send_event(self, event: str, data: object) -> None:
        self.send_raw(sse(event, data))

    def send_raw(self, data: bytes) -> None:
        with self.writing():
            self.wfile.write(data)
            self.wfile.flush()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """A write to the page: a connection that fails (closed, reset) or takes nothing for SEND_TIMEOUT
        is a page that has gone (ClientLeft), and the work it asked for stops."""
        try:
            yield
        except TimeoutError:
            raise ClientLeft(f"the page stopped reading for {self.timeout:g} s") from None
        except OSError:
            raise ClientLeft("the page left") from None

    @contextmanager
    def models_held(self) -> Iterator[None]:
        """Hold the models; while another page has them, say so and wait."""
        if not self.app.lock.acquire(blocking=False):
            self.send_event("wait", {"message": "another page is using the models: this one starts when it is done"})
            while not self.app.lock.acquire(timeout=0.5):
                if self.app.stopping.is_set():
                    raise ServerStopping
                self.send_raw(b": waiting\n\n")  # a comment line: it fails once the page has gone
        try:
            yield
        finally:
            self.app.lock.release()

    def write(self, query: dict) -> None:
        """Write the story with each model asked for, one token of each in turn, as events."""
        app = self.app
        req = live.parse_write(query, list(app.models), app.tokenizer.vocab_size, app.limits)
        prompt = app.tokenizer.encode(req.prompt) or [app.tokenizer.eot]
        run = {"request": asdict(req), "tokens": 0, "stopped": None}
        with self.stream("writing", run), self.models_held():
            app.runs.append(run)
            self.send_event("start", {"prompt": live.token_texts(app.tokenizer, prompt), "models": list(req.models)})
            self.send_story(req, prompt, run)

    def send_story(self, req: live.WriteRequest, prompt: list[int], run: dict) -> None:
        """The token events of every model asked for, then each one's first-token time and median."""
        app = self.app
        ms: dict[str, list[float]] = {name: [] for name in req.models}
        stories = [live.write_story(app.models[name], name, prompt, req.tokens, req.temperature, req.top_k,
                                    req.seed, app.tokenizer) for name in req.models]
        with closing(live.interleave(stories)) as events:  # closed early too: every generate stops
            for event in events:
                if app.stopping.is_set():
                    raise ServerStopping
                self.send_event("token", event)
                ms[event.model].append(event.ms)
                run["tokens"] += 1
        self.send_event("done", {name: live.summary(times) for name, times in ms.items()})

    def read(self, query: dict) -> None:
        """A held-out piece and each token's loss, one method at a time (the slow ones take seconds)."""
        app = self.app
        name = one_model(query, app)
        model = app.models[name]
        if app.pieces(model) == 0:
            raise LiveError("no held-out piece of three windows to read: prepare the data "
                            "(`python scripts/prepare.py`) or pass --data-dir")
        piece = live.field(query, "piece", int, 0, app.pieces(model) - 1, 0)
        ids = next(islice(windows(app.val, 3 * model.config.block_size), piece, None))  # as context.py cuts them
        methods, notes = live.methods_for(model, LOSS_METHODS)
        with self.stream("reading"):
            self.send_event("piece", {"model": name, "piece": piece, "window": model.config.block_size,
                                      "tokens": live.token_texts(app.tokenizer, ids.tolist()), "methods": methods,
                                      "notes": notes})
            with self.models_held():
                if (name, piece) not in app.scored:  # scored once per piece: the sliding window takes a while
                    stream = ids[None].to(model.wte.weight.device)
                    results = []
                    for result in live.score_piece(model, stream, LOSS_METHODS):
                        results.append(result)
                        self.send_event("scored", result)
                    app.scored[(name, piece)] = results
                else:
                    for result in app.scored[(name, piece)]:
                        self.send_event("scored", result)
            self.send_event("done", {})


def one_model(query: dict, app: Live) -> str:
    names = live.parse_models(query, list(app.models))
    if len(names) != 1:
        raise LiveError(f"one model at a time here, not {len(names)}: choose one of {', '.join(app.models)}")
    return names[0]


def failure(doing: str, e: Exception) -> str:
    """An exception as one line for the page: what failed, and the first line of what it said."""
    said = str(e).strip().splitlines()
    text = said[0] if said else "no message"
    return f"{doing} failed: {text}" + ("" if isinstance(e, LiveError) else f" ({type(e).__name__})")


def is_loopback(address: str) -> bool:
    """Whether address (text) is one of this machine's loopback addresses: 127.0.0.0/8, ::1, or
    127.x.y.z written as IPv6 (::ffff:127.0.0.1). A name, or any other spelling, is not."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def host_name(header: str) -> str:
    """The host a Host header names, in lower case (an IPv6 address without its brackets); a LiveError
    where it is not a name or address with an optional port (localhost, localhost:8000, [::1]:8000)."""
    m = HOST.fullmatch(header.strip())
    v6_ok = m is not None and (m["v6"] is None or is_address(m["v6"]))
    if m is None or not v6_ok or int(m["port"] or 0) > 65535:
        raise LiveError(f"bad Host header {header[:80]!r}: send a name or address and an optional port, "
                        "such as localhost:8000 or [::1]:8000")
    return (m["v6"] or m["name"]).lower()


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def url(server: LiveServer) -> str:
    """The address a server listens on, as a browser takes it (an IPv6 address in brackets)."""
    host, port = server.server_address[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


# ----------------------------------------------------------------------------------------------
# Start, serve, stop


def run_name(path: str) -> str:
    """A model's name on the page: its run folder's name (checkpoints/pretrain-rope -> pretrain-rope)."""
    p = Path(path)
    if p.is_dir():
        return p.resolve().name
    return p.resolve().parent.name if p.name == CHECKPOINT_NAME else p.stem


def load_app(args: argparse.Namespace) -> Live:
    """The models, tokenizer and held-out tokens; a checkpoint that does not load is one line, exit 1."""
    device = pick_device(args.device)
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir) or tokenizer.hash
    models: dict[str, GPT] = {}
    for path in args.checkpoints:
        name = run_name(path)
        if name in models:
            raise UserError(f"two checkpoints are named {name}: give each its own run folder")
        models[name] = load_source(find_model(path, tok_hash), device, tok_hash)  # a LoRA run: on its base
    # the step each model writes with, as sample.py chooses it, for the longest story a page may ask for
    decoding = "; ".join(f"{name}: {use_decode_step(model, args.decode_step, args.max_tokens)}"
                         for name, model in models.items())
    return Live(models, tokenizer, load_tokens(args.data_dir, "val"), Limits(tokens=args.max_tokens),
                decoding=decoding)


class LiveServer(ThreadingHTTPServer):
    """A thread per request; stopping waits for them. A thread left inside torch while Python exits can
    abort the process ("terminate called without an active exception"), so none is left behind."""

    daemon_threads = False  # server_close() joins every request's thread
    request_queue_size = 128  # connections waiting to be accepted: socketserver's 5 resets a burst of page loads

    def __init__(self, address: tuple, handler: type[Handler], family: int = socket.AF_INET) -> None:
        self.address_family = family  # read by TCPServer's __init__: AF_INET6 for an IPv6 address
        super().__init__(address, handler)
        self.open: set[socket.socket] = set()  # the connections being answered
        self.open_lock = threading.Lock()

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        with self.open_lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:
        with self.open_lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def hang_up(self) -> None:
        """Shut every connection both ways: a thread waiting for a request stops now, a stream at its
        next write (the token or the method it is computing finishes first)."""
        with self.open_lock:
            for request in self.open:
                try:
                    request.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the other side

    def handle_error(self, request: socket.socket, client_address: tuple) -> None:
        if isinstance(sys.exc_info()[1], OSError | ClientLeft):
            return  # the page left or stalled mid-answer (a reset, a broken pipe, a timeout): no one to tell
        super().handle_error(request, client_address)


def host_arg(text: str) -> str:
    """--host, never empty: an empty name would listen on every address (a `--host "$HOST"` whose variable
    is unset would open the page to the network without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give an address (127.0.0.1, the default; 0.0.0.0 to let other "
                                         "machines in)")
    return text.strip()


def make_server(app: Live, host: str, port: int) -> LiveServer:
    """A threaded server (each page's stream on its own thread) for app, listening on host:port: on the
    first of host's addresses that binds, IPv4 or IPv6. Where that address is loopback, whatever --host
    spelled (127.1, localhost, ::1), it answers to localhost only; elsewhere, to any name."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1], as in a URL
    where = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
    try:
        found = socket.getaddrinfo(name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        said = e.strerror if isinstance(e, socket.gaierror) else "not a host name"
        fix = "give --host the address alone, and the port with --port" if ":" in name and not is_address(name) \
            else "give --host an address or name of this machine (127.0.0.1, the default; 0.0.0.0 for all of them)"
        raise UserError(f"cannot listen on {host}: it has no address ({said}): {fix}") from None
    errors: list[tuple[str, OSError]] = []
    for family, _, _, _, address in dict.fromkeys((f, t, p, c, a) for f, t, p, c, a in found):
        try:
            server = LiveServer(address, Handler, family)
            break
        except OSError as e:
            errors.append((address[0], e))
    else:
        raise UserError(listen_error(where, port, errors)) from None
    server.app = app
    server.local_only = is_loopback(server.server_address[0])  # where it listens, not how --host spelled it
    return server


def listen_error(where: str, port: int, errors: list[tuple[str, OSError]]) -> str:
    """One line for a server that could not listen: what the system said, and the fix for that. Where
    host has several addresses and none binds, a port in use is the one to tell."""
    address, e = next(((a, e) for a, e in errors if e.errno == errno.EADDRINUSE), errors[0])
    v6 = ":" in address
    fixes = {
        errno.EADDRINUSE: "pick another --port (--port 0 takes any free one)",
        errno.EADDRNOTAVAIL: "this machine has no IPv6 loopback: give --host 127.0.0.1" if is_loopback(address) and v6
        else f"{address} is not an address of this machine: give --host one of its own (127.0.0.1, the default; "
             "0.0.0.0 for all of them)",
        errno.EAFNOSUPPORT: "this machine has no IPv6: give --host an IPv4 address, such as 127.0.0.1",
        errno.EACCES: "ports below 1024 need root: pick --port 1024 or above" if 0 < port < 1024
        else "check --host and --port",
    }
    return f"cannot listen on {where} ({e.strerror}): {fixes.get(e.errno, 'check --host and --port')}"


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=model_arg,
                   help="run folders or checkpoint files (a LoRA run folder: its base, with the adapter)")
    p.add_argument("--port", type=port_number, default=8000, help="0: any free port")
    p.add_argument("--host", type=host_arg, default="127.0.0.1",
                   help="the address to listen on (default: this machine only, as ::1 is; 0.0.0.0 lets others in)")
    p.add_argument("--max-tokens", type=MAX_TOKENS, default=1024, help="the most tokens a page may ask for")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR),
                   help="the tokenizer and the held-out tokens")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    add_decode_step_arg(p)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    app = load_app(args)
    print(app.decoding, flush=True)  # the first line: which step writes each model's tokens
    server = make_server(app, args.host, args.port)

    def stop(signum: int, frame: object) -> None:
        app.stopping.set()  # streams end at their next token, and the loop below at its next turn

    # Ctrl-C and SIGTERM stop it, whatever the shell that started it did with them (a shell's background
    # job starts with Ctrl-C ignored, and Python then leaves it so). They only set a flag: a
    # KeyboardInterrupt could land anywhere in the main thread, and be caught there and lost.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    wide = "" if server.local_only else "; other machines can reach it too, under any name"
    print(f"serving {url(server)} (Ctrl-C stops it){wide}", flush=True)
    server.timeout = 0.5  # handle_request returns at least this often, to look at the flag
    try:
        while not app.stopping.is_set():
            server.handle_request()  # a request's answer runs on a thread of its own
        server.hang_up()  # connections that are still to send a request end now
        if app.lock.locked():  # a page's step is running: reading a piece can take seconds
            print(WAITING, flush=True)
    finally:
        server.server_close()  # waits for every request's thread: none is left inside torch at exit
    print("stopped", flush=True)


if __name__ == "__main__":
    run_main(main)
