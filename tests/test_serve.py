"""scripts/serve.py: the live page's server on tiny checkpoints, through real HTTP, and the page itself
in headless Chromium (skipped, with the reason, where none can be had)."""

from __future__ import annotations

import errno
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import context
import pytest
import serve
import torch
from conftest import ROOT, sharpen, tiny_model
from test_runs import lora_on

from mvgpt.checkpoint import load_model, save_checkpoint
from mvgpt.data import data_tokenizer_hash, load_tokens
from mvgpt.kit.errors import UserError
from mvgpt.lora import save_adapter, weights_hash
from mvgpt.model import KVCache
from mvgpt.perf.fast_decode import FastDecode
from mvgpt.tokenizer import Tokenizer

W = 16  # conftest's tiny window


@pytest.fixture(scope="module")
def checkpoints(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(folder / "tiny-rope", sharpen(tiny_model(vocab_size=300, rope=True)), tokenizer_hash=h)
    save_checkpoint(folder / "tiny", sharpen(tiny_model(1, vocab_size=300)), tokenizer_hash=h)
    return folder


@pytest.fixture(scope="module")
def server(checkpoints, data_dir):
    args = serve.parser().parse_args([str(checkpoints / "tiny-rope"), str(checkpoints / "tiny"), "--data-dir",
                                      str(data_dir), "--device", "cpu", "--max-tokens", "2000"])
    srv = serve.make_server(serve.load_app(args), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def get(srv, path: str, host: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=180)
    conn.putrequest("GET", path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), body


def raw(srv, request: bytes, timeout: float = 30) -> tuple[int, dict, bytes]:
    """A request sent as bytes, exactly (malformed ones too), and the answer read to the end."""
    with socket.create_connection(srv.server_address[:2], timeout=timeout) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    return int(status_line.split()[1]), dict(line.split(": ", 1) for line in lines), body


@contextmanager
def serving(app, host: str = "127.0.0.1"):
    """A server of its own for app on host, any free port, stopped at the end."""
    srv = serve.make_server(app, host, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def can_bind(address: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def events(body: bytes) -> list[tuple[str, dict]]:
    """A server-sent event stream's (event, data) pairs; comment lines are skipped."""
    out = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":"))
        if "data" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def generated(model, tokenizer: Tokenizer, prompt: str, n: int, temperature: float, top_k: int, seed: int) -> list[int]:
    idx = torch.tensor([tokenizer.encode(prompt)])
    return [t.item() for t in model.generate(idx, n, temperature, top_k, seed)]


def wait_until_free(app, seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while app.lock.locked() and time.monotonic() < end:
        time.sleep(0.02)
    assert not app.lock.locked(), "the models are still held"


# ----------------------------------------------------------------------------------------------
# What the page gets


LEARNED_AUTO = ("decoding with model.py's step: auto takes the C step for rope models, whose cache slides "
                "(--decode-step c: here too)")


@pytest.mark.parametrize("choice", [None, "auto", "c", "model"])
def test_each_decode_step_is_put_in_place_and_said_first(checkpoints, data_dir, choice):
    """--decode-step: auto (the default) takes the C step where it pays for the longest story a page may ask
    (the rope model), c wherever it builds (both), model never; the first line says which, model by model."""
    argv = [str(checkpoints / "tiny-rope"), str(checkpoints / "tiny"), "--data-dir", str(data_dir), "--device", "cpu"]
    app = serve.load_app(serve.parser().parse_args(argv + (["--decode-step", choice] if choice else [])))
    c_step = r"decoding with the C step \(mvgpt/perf/one_token\.c(, built in [\d.]+ s)?\)"
    own = re.escape("decoding with model.py's step (--decode-step model)")
    said = {"auto": f"tiny-rope: {c_step}; tiny: {re.escape(LEARNED_AUTO)}",
            "c": f"tiny-rope: {c_step}; tiny: {c_step}", "model": f"tiny-rope: {own}; tiny: {own}"}[choice or "auto"]
    assert re.fullmatch(said, app.decoding), app.decoding
    in_c = {name: isinstance(model.decode, FastDecode) for name, model in app.models.items()}
    assert in_c == {"tiny-rope": choice != "model", "tiny": choice == "c"}


def test_info_lists_the_models_and_the_limits(server):
    status, _, body = get(server, "/api/info")
    info = json.loads(body)
    assert status == 200 and [(m["name"], m["rope"], m["window"], m["capacity"]) for m in info["models"]] == [
        ("tiny-rope", True, W, 2 * W), ("tiny", False, W, 2 * W)]
    assert info["limits"]["tokens"] == 2000 and info["models"][0]["pairs"] == 8


def test_the_write_stream_is_generates_tokens_side_by_side(server):
    app = server.app
    status, headers, body = get(server, "/api/write?models=tiny-rope,tiny&prompt=Lily%20saw&tokens=40"
                                        "&temperature=0.9&top_k=30&seed=5")
    got = events(body)
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert got[0] == ("start", {"prompt": serve.live.token_texts(app.tokenizer, app.tokenizer.encode("Lily saw")),
                                "models": ["tiny-rope", "tiny"]})
    tokens = [data for name, data in got if name == "token"]
    assert [t["model"] for t in tokens] == ["tiny-rope", "tiny"] * 40
    for name, model in app.models.items():
        mine = [t for t in tokens if t["model"] == name]
        assert [t["token"] for t in mine] == generated(model, app.tokenizer, "Lily saw", 40, 0.9, 30, 5)
        assert got[-1][0] == "done" and got[-1][1][name] == {"tokens": 40, "first_ms": mine[0]["ms"],
                                                             "median_ms": statistics.median(t["ms"] for t in mine[1:])}
        assert model.new_cache is KVCache
    rope, learned = ([t for t in tokens if t["model"] == name] for name in ("tiny-rope", "tiny"))
    assert sum(t["dropped"] is not None for t in rope) == 40 - 1 - (W - 3) and all(t["rerun"] is None for t in rope)
    assert sum(t["rerun"] is not None for t in learned) == 40 - 1 - (W - 3) and all(t["position"] <= W for t in learned)
    assert app.runs[-1] == {"request": {"prompt": "Lily saw", "models": ("tiny-rope", "tiny"), "temperature": 0.9,
                                        "top_k": 30, "tokens": 40, "seed": 5}, "tokens": 80, "stopped": None}


@pytest.mark.parametrize("model", ["tiny-rope", "tiny"])
def test_the_read_view_is_context_pys_losses_on_context_pys_piece(server, data_dir, model):
    app = server.app
    status, _, body = get(server, f"/api/read?model={model}&piece=2")
    got = events(body)
    piece = torch.from_numpy(load_tokens(data_dir, "val")[2 * 3 * W : 3 * 3 * W].astype("int64"))[None]
    assert status == 200 and got[0][0] == "piece" and got[-1] == ("done", {})
    assert got[0][1]["tokens"] == serve.live.token_texts(app.tokenizer, piece[0].tolist())
    scored = {data["method"]: data for name, data in got if name == "scored"}
    m = app.models[model]
    expected = {"sliding window": context.window_losses(m, piece)}
    if model == "tiny-rope":
        expected |= {"sliding cache": context.cache_losses(m, piece), "full context": context.full_losses(m, piece)}
    assert list(scored) == list(expected) == got[0][1]["methods"]
    for method, losses in expected.items():
        assert scored[method]["losses"] == losses.tolist() and scored[method]["mean"] == losses.mean().item()
    again = events(get(server, f"/api/read?model={model}&piece=2")[2])  # the second time, from memory
    assert [d["losses"] for n, d in again if n == "scored"] == [d["losses"] for d in scored.values()]


def test_the_angles_view_is_live_angles_view(server):
    status, _, body = get(server, "/api/angles?model=tiny-rope&ctx=48&pair=3")
    config = server.app.models["tiny-rope"].config
    assert status == 200 and json.loads(body) == json.loads(json.dumps(serve.live.angles_view(config, 48, 3)))


# ----------------------------------------------------------------------------------------------
# Edges


@pytest.mark.parametrize("path, status, message", [
    ("/api/write?models=tiny&prompt=" + "a" * 2001, 400, "prompt: 2,001 characters is over the limit of 2,000"),
    ("/api/write?models=gpt-4", 400, "unknown model 'gpt-4': this server has tiny-rope, tiny"),
    ("/api/write?models=tiny&temperature=warm", 400, "temperature: 'warm' is not a number"),
    ("/api/write?models=tiny&top_k=-3", 400, "top_k: -3 is out of range: give a whole number from 1 to 300"),
    ("/api/write?models=tiny&tokens=2001", 400, "tokens: 2001 is out of range: give a whole number from 1 to 2,000"),
    ("/api/write?models=tiny&seed=x", 400, "seed: 'x' is not a number"),
    ("/api/read?model=tiny-rope,tiny", 400, "one model at a time here, not 2"),
    ("/api/read?model=tiny&piece=999999", 400, "piece: 999999 is out of range"),
    ("/api/angles?model=tiny", 400, "tiny has learned positions: it has no rotary angles"),
    ("/api/angles?model=tiny-rope&ctx=8", 400, "ctx: 8 is out of range: give a whole number from 16 to 256"),
    ("/api/angles?model=tiny-rope&pair=8", 400, "pair: 8 is out of range: give a whole number from 0 to 7"),
    ("/api/nothing", 404, "no such page: /api/nothing"),
])
def test_a_bad_request_is_answered_with_one_line(server, path, status, message):
    got, _, body = get(server, path)
    assert got == status and json.loads(body)["error"].startswith(message)


@pytest.mark.parametrize("path", ["/../scripts/serve.py", "/%2e%2e/mvgpt/live/views.py", "/..%2fmvgpt%2flive.py",
                                  "/static/index.html", "//etc/passwd", "/index.html/../../serve.py",
                                  "/static/../../pyproject.toml", "/live.js%00.html"])
def test_only_the_pages_own_files_are_served(server, path):
    status, _, body = get(server, path)
    assert status == 404 and b"no such page" in body


def test_the_page_and_its_files_are_served_with_a_policy_of_its_own_files_only(server):
    for path, kind, name in [("/", "text/html", "index.html"), ("/live.js", "text/javascript", "live.js"),
                             ("/live.css", "text/css", "live.css"), ("/favicon.svg", "image/svg+xml", "favicon.svg")]:
        status, headers, body = get(server, path)
        assert status == 200 and headers["Content-Type"].startswith(kind)
        assert body == (ROOT / "mvgpt" / "live" / "static" / name).read_bytes()
        assert headers["Content-Security-Policy"] == "default-src 'self'"
    html = (ROOT / "mvgpt" / "live" / "static" / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing from the network


def test_a_page_from_another_host_name_is_refused(server):
    port = server.server_address[1]
    assert get(server, "/api/info", host=f"evil.example:{port}")[0] == 403  # DNS rebinding
    assert get(server, "/api/info", host=f"localhost:{port}")[0] == 200


LOCAL_HOSTS = ["localhost", "LocalHost:{port}", "127.0.0.1", "127.0.0.1:{port}", "127.8.9.10:{port}", "[::1]",
               "[::1]:{port}", "[::ffff:127.0.0.1]:{port}", "localhost:"]
OTHER_HOSTS = [None, "", "evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example:{port}",
               "0.0.0.0:{port}", "[::]:{port}", "192.168.1.5", "127.1", "[::2]:{port}"]


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.1", "localhost", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_a_server_on_a_loopback_address_answers_to_this_machines_names_only(server, bind):
    """Where it listens decides, not how --host spelled it: 127.1 binds 127.0.0.1 and is as closed."""
    if ":" in bind and not can_bind(bind):
        pytest.skip(f"this machine cannot bind {bind}")
    with serving(server.app, bind) as srv:
        assert srv.local_only
        port = srv.server_address[1]
        for host in LOCAL_HOSTS:
            assert get(srv, "/api/info", host=host.format(port=port))[0] == 200, host
        for host in OTHER_HOSTS:
            request = b"GET /api/info HTTP/1.0\r\n" + (b"" if host is None else f"Host: {host}\r\n".format(
                port=port).encode()) + b"\r\n"
            status, headers, body = raw(srv, request)
            assert (status, headers["Content-Type"], json.loads(body)) == (403, "application/json", {
                "error": f"this server answers to localhost only: open {serve.url(srv)} on this machine"}), host


def test_a_server_on_every_address_answers_to_any_name(server):
    with serving(server.app, "0.0.0.0") as srv:
        assert not srv.local_only  # asked for: other machines, under any name
        for host in ["evil.example", "192.168.1.5:80", "localhost"]:
            assert get(srv, "/api/info", host=host)[0] == 200
        assert get(srv, "/api/info", host="[::1")[0] == 400  # malformed is malformed on any server


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.255.0.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("127.1", False),
    ("localhost", False), ("", False)])
def test_loopback_is_an_address_not_a_spelling(address, loopback):
    assert serve.is_loopback(address) is loopback


@pytest.mark.parametrize("request_bytes, status, message", [
    (b"GET /api/info HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, "bad Host header '[::1': send a name or address"),
    (b"GET /api/info HTTP/1.1\r\nHost: localhost:abc\r\n\r\n", 400, "bad Host header 'localhost:abc'"),
    (b"GET /api/info HTTP/1.1\r\nHost: localhost:99999\r\n\r\n", 400, "bad Host header 'localhost:99999'"),
    (b"GET /api/info HTTP/1.1\r\nHost: [evil.example]\r\n\r\n", 400, "bad Host header '[evil.example]'"),
    (b"GET /api/info HTTP/1.1\r\nHost: local host\r\n\r\n", 400, "bad Host header 'local host'"),
    (b"GET /api/info HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n", 400, "2 Host headers: send one"),
    (b"GET //[x HTTP/1.1\r\nHost: localhost\r\n\r\n", 404, "no such page: /[x"),  # http.server keeps one /
    (b"GET http://localhost/api/info HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
     "the request's target must be a path, such as /api/info, not 'http://localhost/api/info'"),
    (b"GARBAGE\r\n\r\n", 400, "Bad request syntax ('GARBAGE')"),
    (b"GET /api/info\r\n", 400, "a request line without its HTTP version is not served"),  # HTTP/0.9: no waiting
    (b"GET /api/info HTTP/x.y\r\nHost: localhost\r\n\r\n", 400, "Bad request version ('HTTP/x.y')"),
    (b"POST /api/write HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", 405,
     "POST is not served: ask with GET"),
    (b"GET /api/info HTTP/1.1\r\nHost: localhost\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, "Line too long"),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "Request-URI Too Long"),
])
def test_a_malformed_request_is_a_4xx_with_one_line_of_json_and_nothing_on_the_terminal(
        server, request_bytes, status, message, capsys):
    got, headers, body = raw(server, request_bytes)
    assert (got, headers["Content-Type"]) == (status, "application/json")
    assert json.loads(body)["error"].startswith(message) and "\n" not in json.loads(body)["error"]
    assert get(server, "/api/info")[0] == 200  # and the server goes on
    assert capsys.readouterr().err == ""


def test_a_page_that_stops_reading_lets_go_of_the_models_within_the_timeout(server, monkeypatch):
    """A client asks for a long story and reads nothing: once the connection's buffers are full, the
    next write waits SEND_TIMEOUT (1 s here) and the stream ends as a page that left, models released."""
    app = server.app
    wait_until_free(app)
    assert serve.Handler.timeout == serve.SEND_TIMEOUT and 10 <= serve.SEND_TIMEOUT <= 30  # what a real page gets
    monkeypatch.setattr(serve.Handler, "timeout", 1.0)
    setup = serve.Handler.setup

    def small_send_buffer(handler) -> None:  # the kernel grows a loopback one past this whole story's megabyte
        setup(handler)
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    monkeypatch.setattr(serve.Handler, "setup", small_send_buffer)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: its window stays small
        s.connect(server.server_address[:2])
        s.sendall(b"GET /api/write?models=tiny-rope,tiny&tokens=2000 HTTP/1.0\r\nHost: localhost\r\n\r\n")
        end = time.monotonic() + 30
        while not (app.runs and app.runs[-1]["request"]["tokens"] == 2000) and time.monotonic() < end:
            time.sleep(0.01)
        stuck = app.runs[-1]
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=20)  # a second page
        conn.request("GET", "/api/write?models=tiny&tokens=5&seed=3&temperature=0")
        got = events(conn.getresponse().read())
        waited = time.monotonic() - t0
        conn.close()
    assert stuck["stopped"] == "the page stopped reading for 1 s" and stuck["tokens"] < 4000
    assert got[0][0] == "wait" and got[-1][0] == "done"
    assert [d["token"] for n, d in got if n == "token"] == generated(app.models["tiny"], app.tokenizer,
                                                                     "Once upon a time", 5, 0.0, 50, 3)
    assert waited < 10  # the story's tokens so far, then 1 s of a full buffer
    wait_until_free(app)


def test_a_failure_inside_a_stream_ends_it_with_an_error_event_and_the_server_goes_on(checkpoints, data_dir,
                                                                                       capsys):
    """A model with a NaN weight: sampling fails mid-story, the read's losses are NaN. Each stream ends
    with one line the page shows, the models are free, the other model still writes, nothing is printed."""
    args = serve.parser().parse_args([str(checkpoints / "tiny-rope"), str(checkpoints / "tiny"), "--data-dir",
                                      str(data_dir), "--device", "cpu"])
    app = serve.load_app(args)
    with torch.no_grad():
        app.models["tiny"].wte.weight.fill_(float("nan"))  # in memory: loading refuses one in a checkpoint
    with serving(app) as srv:
        status, _, body = get(srv, "/api/write?models=tiny&tokens=20")
        got = events(body)
        assert status == 200 and [n for n, _ in got] == ["start", "error"]
        assert got[-1][1] == {"message": "writing failed: probability tensor contains either `inf`, `nan` or "
                                         "element < 0 (RuntimeError)"}
        assert app.runs[-1]["stopped"] == got[-1][1]["message"] and not app.lock.locked()
        got = events(get(srv, "/api/read?model=tiny")[2])
        assert [n for n, _ in got] == ["piece", "error"] and got[-1][1] == {
            "message": "reading failed: a scored event holds a value that is not a number (NaN or infinity): the "
                       "checkpoint's weights may hold one"}
        assert not app.lock.locked() and ("tiny", 0) not in app.scored
        got = events(get(srv, "/api/write?models=tiny-rope&tokens=5")[2])
        assert [n for n, _ in got] == ["start", *["token"] * 5, "done"]
    assert capsys.readouterr().err == ""


def test_a_page_that_leaves_mid_story_stops_the_generation(server):
    app = server.app
    wait_until_free(app)
    with socket.create_connection(server.server_address[:2], timeout=30) as s:
        s.sendall(b"GET /api/write?models=tiny&tokens=2000 HTTP/1.0\r\nHost: localhost\r\n\r\n")
        received = b""
        while b"event: token" not in received:
            received += s.recv(4096)
    wait_until_free(app)
    run = app.runs[-1]
    assert run["request"]["tokens"] == 2000 and run["stopped"] == "the page left" and run["tokens"] < 2000
    assert app.models["tiny"].new_cache is KVCache
    assert get(server, "/api/info")[0] == 200  # and the server goes on


def test_a_second_page_waits_with_a_message_then_gets_its_story(server):
    app = server.app
    wait_until_free(app)
    answer = {}
    app.lock.acquire()  # another page is writing
    try:
        thread = threading.Thread(target=lambda: answer.update(got=get(server, "/api/write?models=tiny-rope&tokens=5"
                                                                                "&seed=2&temperature=0")))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # waiting
    finally:
        app.lock.release()
    thread.join(60)
    got = events(answer["got"][2])
    assert got[0] == ("wait", {"message": "another page is using the models: this one starts when it is done"})
    assert [d["token"] for n, d in got if n == "token"] == generated(app.models["tiny-rope"], app.tokenizer,
                                                                     "Once upon a time", 5, 0.0, 50, 2)


def test_two_pages_at_once_both_get_their_stories(server):
    answers = [{}, {}]
    threads = [threading.Thread(target=lambda a=a, m=m: a.update(got=get(server, f"/api/write?models={m}&tokens=60")))
               for a, m in zip(answers, ["tiny-rope", "tiny"], strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for a in answers:
        got = events(a["got"][2])
        assert sum(n == "token" for n, _ in got) == 60 and got[-1][0] == "done"


# ----------------------------------------------------------------------------------------------
# Starting and stopping


def test_it_listens_on_localhost_unless_told(server, checkpoints, data_dir):
    args = serve.parser().parse_args([str(checkpoints / "tiny"), "--data-dir", str(data_dir)])
    assert args.host == "127.0.0.1" and args.port == 8000
    assert server.server_address[0] == "127.0.0.1" and server.local_only
    wide = serve.make_server(server.app, "0.0.0.0", 0)
    assert not wide.local_only  # asked for: other machines, under any name
    wide.server_close()


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_host_is_refused_not_taken_for_every_address(checkpoints, data_dir, capsys, host):
    """`--host "$HOST"` with the variable unset would otherwise listen on every address, as 0.0.0.0 does."""
    with pytest.raises(SystemExit) as e:
        serve.parser().parse_args([str(checkpoints / "tiny"), "--data-dir", str(data_dir), "--host", host])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(
        "error: argument --host: is empty: give an address (127.0.0.1, the default; 0.0.0.0 to let other machines in)")


def test_a_port_in_use_is_one_line(server):
    with pytest.raises(UserError, match=r"^error: cannot listen on 127.0.0.1:\d+ \(Address already in use\): pick "
                                        "another --port"):
        serve.make_server(server.app, "127.0.0.1", server.server_address[1])


@pytest.mark.parametrize("host, message", [
    ("no-such-host.invalid", r"cannot listen on no-such-host.invalid: it has no address \(.+\): give --host an "
                             r"address or name of this machine \(127.0.0.1, the default; 0.0.0.0 for all of them\)$"),
    ("127.0.0.1:8000", r"cannot listen on 127.0.0.1:8000: it has no address \(.+\): give --host the address "
                       "alone, and the port with --port$"),
    ("a..b", r"cannot listen on a..b: it has no address \(not a host name\): give --host an address"),
    ("192.0.2.1", r"cannot listen on 192.0.2.1:0 \(Cannot assign requested address\): 192.0.2.1 is not an address "
                  r"of this machine: give --host one of its own \(127.0.0.1, the default; 0.0.0.0 for all of them\)$"),
])
def test_a_host_that_cannot_be_listened_on_is_one_line_naming_the_problem(server, host, message):
    with pytest.raises(UserError, match="^error: " + message):
        serve.make_server(server.app, host, 0)


@pytest.mark.parametrize("errno_, port, fix", [
    (errno.EAFNOSUPPORT, 8000, "this machine has no IPv6: give --host an IPv4 address, such as 127.0.0.1"),
    (errno.EADDRNOTAVAIL, 8000, "this machine has no IPv6 loopback: give --host 127.0.0.1"),
    (errno.EACCES, 80, "ports below 1024 need root: pick --port 1024 or above"),
])
def test_a_machine_without_ipv6_or_a_low_port_is_one_line(errno_, port, fix):
    error = OSError(errno_, os.strerror(errno_))
    assert serve.listen_error(f"[::1]:{port}", port, [("::1", error)]) == (
        f"cannot listen on [::1]:{port} ({os.strerror(errno_)}): {fix}")


@pytest.mark.parametrize("argv, message", [
    (["--port", "70000"], "--port: 70000 is out of range: give a whole number from 0 to 65535"),
    (["--max-tokens", "0"], "--max-tokens: 0 is out of range"),
    (["--max-tokens", "1000000"], "--max-tokens: 1000000 is out of range: give a whole number from 1 to 100,000"),
])
def test_bad_flags_are_one_line(checkpoints, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        serve.main([str(checkpoints / "tiny"), *argv])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"error: argument {message}")


def test_a_checkpoint_that_does_not_load_is_one_line_and_exit_1(checkpoints, data_dir, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as e:
        serve.main([str(checkpoints / "tiny"), str(tmp_path / "broken"), "--data-dir", str(data_dir)])
    assert str(e.value.code).startswith("error: checkpoint ") and "truncated or corrupt" in str(e.value.code)
    assert "\n" not in str(e.value.code)  # SystemExit with a message: printed as one line, exit status 1
    with pytest.raises(SystemExit, match="two checkpoints are named tiny"):
        serve.main([str(checkpoints / "tiny"), str(checkpoints / "tiny" / "ckpt.pt"), "--data-dir", str(data_dir)])


def test_a_lora_run_folder_is_served_on_its_base(checkpoints, data_dir, tmp_path):
    h = data_tokenizer_hash(data_dir)
    base = load_model(checkpoints / "tiny-rope", "cpu", h)[0]
    adapted = lora_on(base).eval()
    save_adapter(tmp_path / "tiny-lora", adapted, weights_hash(base), h, base=str(checkpoints / "tiny-rope"))
    app = serve.load_app(serve.parser().parse_args([str(checkpoints / "tiny-rope"), str(tmp_path / "tiny-lora"),
                                                    "--data-dir", str(data_dir), "--device", "cpu"]))
    assert list(app.models) == ["tiny-rope", "tiny-lora"]
    x = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(app.models["tiny-lora"](x)[0], adapted(x)[0], rtol=0, atol=0)
        assert not torch.equal(app.models["tiny-lora"](x)[0], app.models["tiny-rope"](x)[0])  # the adapter is on


@pytest.mark.parametrize("how", ["SIGINT", "SIGINT, started in the background", "SIGTERM", "SIGINT, mid-story",
                                 "SIGINT, mid-read", "SIGINT, with a connection that sent nothing"])
def test_the_command_says_its_address_in_one_line_and_ctrl_c_stops_it(checkpoints, data_dir, how):
    """Ctrl-C stops it, also where it was started as a shell's background job (which ignores Ctrl-C, a
    setting Python keeps unless told otherwise), and so does SIGTERM; cleanly (exit 0, nothing on stderr)
    while a page's story is being written or a piece read (a thread left inside torch at exit can abort
    the process), and at once with a connection open that never sent its request (a browser's preconnect)."""
    background = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if "background" in how else None
    child = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), str(checkpoints / "tiny-rope"),
                              "--data-dir", str(data_dir), "--device", "cpu", "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)),  # this checkout's mvgpt
                             preexec_fn=background)
    try:
        first = child.stdout.readline()  # which step writes: the C step, where it pays for --max-tokens (1024)
        assert re.fullmatch(r"tiny-rope: decoding with the C step \(mvgpt/perf/one_token\.c(, built in [\d.]+ s)?\)\n",
                            first), first
        line = child.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:") and line.endswith("/ (Ctrl-C stops it)\n")
        port = int(line.split(":")[2].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/api/info")
        assert conn.getresponse().status == 200  # its connection still open when the signal comes
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            if "mid-" in how:  # the signal comes once the stream has begun, its thread inside the model
                path = b"/api/write?models=tiny-rope&tokens=1024" if "story" in how else b"/api/read?model=tiny-rope"
                s.sendall(b"GET " + path + b" HTTP/1.0\r\nHost: localhost\r\n\r\n")
                received = b""
                while b"event: " not in received:
                    received += s.recv(4096)
            t0 = time.monotonic()
            child.send_signal(getattr(signal, how.split(",")[0]))
            out, err = child.communicate(timeout=30)
            assert time.monotonic() - t0 < 10
    finally:
        if child.poll() is None:
            child.kill()
    # where a model was still on a step when the loop saw the signal, it says it waits for it
    assert child.returncode == 0 and out in ("stopped\n", serve.WAITING + "\nstopped\n") and err == ""
    if "mid-" not in how:
        assert out == "stopped\n"


@pytest.mark.parametrize("host, connect, note", [
    ("::1", "::1", ""),  # IPv6: the address in brackets, and as closed as 127.0.0.1
    ("0.0.0.0", "127.0.0.1", "; other machines can reach it too, under any name"),
])
def test_the_first_line_says_where_it_listens_and_who_may_ask(checkpoints, data_dir, host, connect, note):
    if ":" in host and not can_bind(host):
        pytest.skip(f"this machine cannot bind {host}")
    child = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "serve.py"), str(checkpoints / "tiny"),
                              "--data-dir", str(data_dir), "--device", "cpu", "--port", "0", "--host", host],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert child.stdout.readline() == f"tiny: {LEARNED_AUTO}\n"  # which step writes, first
        line = child.stdout.readline()
        shown = f"[{host}]" if ":" in host else host
        assert line.startswith(f"serving http://{shown}:") and line.endswith(f"/ (Ctrl-C stops it){note}\n"), line
        port = int(line.split("/ (")[0].rsplit(":", 1)[1])
        conn = http.client.HTTPConnection(connect, port, timeout=30)
        conn.putrequest("GET", "/api/info", skip_host=True)
        conn.putheader("Host", "evil.example")
        conn.endheaders()
        assert conn.getresponse().status == (200 if note else 403)  # who may ask: any name, or localhost only
        conn.close()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0 and out == "stopped\n" and err == ""


# ----------------------------------------------------------------------------------------------
# The page in a real browser

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    """Debian's chromium and the Playwright driver, or skip saying which is missing."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")  # the test is marked browser: it is there
    pytest.importorskip("playwright.sync_api", reason="no Playwright driver: pip install -e '.[dev]'")
    return path


def check_the_write_view(page, app) -> None:
    """40 tokens written: each column's text is generate's, its cache drawn as its fields say."""
    page.fill("#tokens", "40")
    page.fill("#seed", "11")
    page.click("#write-go")
    page.wait_for_selector("#write[data-state=done]", timeout=180_000)
    P = len(app.tokenizer.encode("Once upon a time"))
    for name, model in app.models.items():
        column = page.locator(f'.column[data-model="{name}"]')
        want = app.tokenizer.decode(generated(model, app.tokenizer, "Once upon a time", 40, 0.8, 50, 11))
        assert column.locator(".story").inner_text() == "Once upon a time" + want
        numbers = column.locator(".numbers").first
        assert numbers.get_attribute("data-position") == str(P + 39 if model.config.rope else W)
        assert numbers.get_attribute("data-length") == str(W)
        assert column.locator("svg.grid rect.held, svg.grid rect.newest").count() == W
        assert column.locator(".ms-numbers").get_attribute("data-median") != ""
        event = column.locator(".event").inner_text()
        if model.config.rope:  # the last token slid the cache: its row is drawn as dropped
            assert column.locator("svg.grid rect.dropped").count() == 1 and event.startswith("slide:")
        else:  # the window ran again: the cache is drawn unused
            assert column.locator("svg.grid.frozen").count() == 1 and event.startswith("re-run:")


@pytest.mark.browser
def test_the_page_writes_40_tokens_and_draws_the_cache_in_chromium(server):
    from playwright.sync_api import sync_playwright

    path, app = chromium(), server.app
    wait_until_free(app)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    problems, asked = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: asked.append(r.url))
            page.goto(base)
            page.wait_for_selector("body[data-ready=yes]", state="attached")
            check_the_write_view(page, app)
            page.click("button[data-view=read]")
            page.click("#read-go")
            page.wait_for_selector("#read[data-state=done]", state="attached", timeout=180_000)
            assert page.locator("#read-text span").count() == 3 * W and page.locator("#read-means tr").count() == 4
            page.click("button[data-view=angles]")
            page.wait_for_selector("#angles[data-state=drawn]", state="attached", timeout=180_000)
            assert page.locator("#speeds polyline").count() == 4 and page.locator("#arrow line.arrow").count() == 4
        finally:
            browser.close()
    assert problems == []  # no console error, no exception on the page
    assert all(url.startswith(base) for url in asked)  # nothing from the network
