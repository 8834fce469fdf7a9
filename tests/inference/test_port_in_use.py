"""A port in use: one line naming port and host, exit 2, for `rldojo serve`, `rldojo
service` and `rldojo dashboard` (they all bind through `rldojo.inference.server`), found
before a model loads."""

from __future__ import annotations

import socket
import sys

import pytest
from typer.testing import CliRunner

from rldojo import cli
from rldojo.inference import ScriptedEngine
from rldojo.inference.server import PortInUseError, bind_port, start_server

pytestmark = pytest.mark.slow  # servers and subprocesses

runner = CliRunner()


@pytest.fixture
def taken_port():
    """A port another socket listens on for the whole test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("rldojo.inference.server.make_engine", refuse)


def _message(port: int) -> str:
    return f"port {port} is in use on 127.0.0.1: pick another with --port"


def test_binding_a_taken_port_is_one_error_naming_port_and_host(taken_port):
    with pytest.raises(PortInUseError) as info:
        bind_port("127.0.0.1", taken_port)
    assert str(info.value) == _message(taken_port)
    free = bind_port("127.0.0.1", 0)  # port 0: any free port
    free.close()


def test_a_server_on_a_taken_port_fails_before_its_model_loads(taken_port, no_model_load):
    with pytest.raises(PortInUseError):
        start_server("tiny-random", port=taken_port)


def test_a_scripted_server_still_serves_on_a_free_port():
    with start_server(ScriptedEngine(lambda request: "hi", model="m")) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10):
            pass  # uvicorn listens on the socket bound for it
        assert server.port > 0


def test_rldojo_serve_on_a_taken_port_is_one_line_exit_2(taken_port, no_model_load):
    result = runner.invoke(cli.app, ["serve", "--model", "tiny-random", "--port",
                                     str(taken_port)])  # fmt: skip
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.strip() == f"error: {_message(taken_port)}"


def _main(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["rldojo", *argv])
    with pytest.raises(SystemExit) as info:
        cli.main()
    captured = capsys.readouterr()
    return info.value.code, captured.out, captured.err.strip()


def test_rldojo_dashboard_on_a_taken_port_is_one_line_exit_2(
    taken_port, tmp_path, monkeypatch, capsys
):
    code, out, err = _main(monkeypatch, capsys, "dashboard", str(tmp_path), "--port",
                           str(taken_port))  # fmt: skip
    assert (code, out, err) == (2, "", f"error: {_message(taken_port)}")


def test_rldojo_service_on_a_taken_port_is_one_line_exit_2(
    taken_port, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("RLDOJO_API_KEYS", "k1")
    code, out, err = _main(monkeypatch, capsys, "service", "--data-dir", str(tmp_path / "d"),
                           "--port", str(taken_port))  # fmt: skip
    assert (code, out, err) == (2, "", f"error: {_message(taken_port)}")
