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
own files are served, and it listens on 127.0.0.1 unless --host says otherwise.

Examples:
    python scripts/serve.py checkpoints/pretrain-rope checkpoints/pretrain     # then open the address
    python scripts/serve.py checkpoints/pretrain-rope --port 8080
    python scripts/serve.py checkpoints/lora-rope checkpoints/pretrain-rope   # a LoRA run, on its base, beside it
    python scripts/serve.py /tmp/tiny --data-dir /tmp/tinydata --device cpu --port 0   # tiny; any free port
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
from context import LOSS_METHODS

from mvgpt.checkpoint import CHECKPOINT_NAME, find_model, load_source, model_arg
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data, windows
from mvgpt.device import pick_device
from mvgpt.kit.errors import ArgumentParser, UserError, at_least, number, run_main
from mvgpt.live import views as live
from mvgpt.live.views import Limits, LiveError, sse
from mvgpt.model import GPT
from mvgpt.perf.fast_decode import use_fast_decode
from mvgpt.tokenizer import Tokenizer

STATIC = Path(live.__file__).with_name("static")  # the page: index.html, live.js, live.css
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
LOCAL_NAMES = {"127.0.0.1", "localhost", "::1"}
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

    @property
    def app(self) -> Live:
        return self.server.app

    def log_message(self, format: str, *args) -> None:
        pass  # the terminal gets one line, the address; the page shows what happens

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if self.server.local_only and urlsplit("//" + self.headers.get("Host", "")).hostname not in LOCAL_NAMES:
            return self.send_json({"error": "this server answers to localhost only"}, 403)  # DNS rebinding
        query = parse_qs(url.query, keep_blank_values=True)
        routes = {"/api/info": self.info, "/api/write": self.write, "/api/read": self.read,
                  "/api/angles": self.angles}
        try:
            if url.path in routes:
                return routes[url.path](query)
            return self.send_page_file(url.path)
        except LiveError as e:
            return self.send_json({"error": str(e)}, 400)

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

    def send_bytes(self, body: bytes, content_type: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY.items():
            self.send_header(name, value)
        self.end_headers()
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

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        for name, value in SECURITY.items():
            self.send_header(name, value)
        self.end_headers()

    def send_event(self, event: str, data: object) -> None:
        self.send_raw(sse(event, data))

    def send_raw(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise ClientLeft from None

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
        self.start_stream()
        try:
            with self.models_held():
                app.runs.append(run)
                self.send_event("start", {"prompt": live.token_texts(app.tokenizer, prompt),
                                          "models": list(req.models)})
                self.send_story(req, prompt, run)
        except ClientLeft:
            run["stopped"] = "the page left"
        except ServerStopping:
            run["stopped"] = "the server is stopping"

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
        self.start_stream()
        try:
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
        except (ClientLeft, ServerStopping):
            pass


def one_model(query: dict, app: Live) -> str:
    names = live.parse_models(query, list(app.models))
    if len(names) != 1:
        raise LiveError(f"one model at a time here, not {len(names)}: choose one of {', '.join(app.models)}")
    return names[0]


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
        models[name] = model = load_source(find_model(path, tok_hash), device, tok_hash)  # a LoRA run: on its base
        if model.config.rope:  # the C step, as sample.py uses it, where it pays for the longest story asked for
            use_fast_decode(model, args.max_tokens)
    return Live(models, tokenizer, load_tokens(args.data_dir, "val"), Limits(tokens=args.max_tokens))


class LiveServer(ThreadingHTTPServer):
    """A thread per request; stopping waits for them. A thread left inside torch while Python exits can
    abort the process ("terminate called without an active exception"), so none is left behind."""

    daemon_threads = False  # server_close() joins every request's thread

    def __init__(self, address: tuple[str, int], handler: type[Handler]) -> None:
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
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the page left mid-answer: there is no one to tell
        super().handle_error(request, client_address)


def make_server(app: Live, host: str, port: int) -> LiveServer:
    """A threaded server (each page's stream on its own thread) for app, listening on host:port."""
    try:
        server = LiveServer((host, port), Handler)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port "
                        "(--port 0 takes any free one)") from None
    server.app = app
    server.local_only = host in LOCAL_NAMES  # --host wider: other machines may ask, under any name
    return server


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=model_arg,
                   help="run folders or checkpoint files (a LoRA run folder: its base, with the adapter)")
    p.add_argument("--port", type=port_number, default=8000, help="0: any free port")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: this machine only; 0.0.0.0 lets others in)")
    p.add_argument("--max-tokens", type=at_least(1), default=1024, help="the most tokens a page may ask for")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR),
                   help="the tokenizer and the held-out tokens")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    app = load_app(args)
    server = make_server(app, args.host, args.port)
    host, port = server.server_address[:2]

    def stop(signum: int, frame: object) -> None:
        app.stopping.set()  # streams end at their next token, and the loop below at its next turn

    # Ctrl-C and SIGTERM stop it, whatever the shell that started it did with them (a shell's background
    # job starts with Ctrl-C ignored, and Python then leaves it so). They only set a flag: a
    # KeyboardInterrupt could land anywhere in the main thread, and be caught there and lost.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"serving http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
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
