"""Keys on disk, the local SQLite state, and input downloads."""

from __future__ import annotations

import hashlib
import stat

import pytest

from providers.agent import keys
from providers.agent.inputs import InputError, fetch_inputs, pack_checkpoint, unpack_checkpoint
from providers.agent.state import State


def test_keys_are_created_private_and_load_back(tmp_path):
    address, bls_key = keys.create_keys(tmp_path, kdf_iterations=2)
    for name in (keys.KEYSTORE, keys.BLS_FILE, keys.PASSWORD):
        assert stat.S_IMODE((tmp_path / "keys" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert keys.eth_address(tmp_path) == address
    assert keys.load_eth(tmp_path).address == address
    loaded = keys.load_bls(tmp_path)
    assert loaded.public_key == bls_key.public_key
    from contracts import bls

    assert bls.pop_verify(loaded.public_key, loaded.proof_of_possession)
    with pytest.raises(keys.KeyError_, match="refusing to overwrite"):
        keys.create_keys(tmp_path)


def test_a_key_file_readable_by_others_is_refused(tmp_path):
    keys.create_keys(tmp_path, kdf_iterations=2)
    (tmp_path / "keys" / keys.BLS_FILE).chmod(0o644)
    with pytest.raises(keys.KeyError_, match="chmod 600"):
        keys.load_bls(tmp_path)


def test_a_duplicate_assignment_is_recorded_once(tmp_path):
    st = State(tmp_path / "state.sqlite3")
    args = dict(trade_id=9, job_id=3, spec={"command": ["true"]}, spec_hash="00" * 32, gpus=[0], duration_s=60, runtime="process")
    assert st.job_accept(**args) is True
    assert st.job_accept(**{**args, "job_id": 4}) is False
    assert st.job(9)["job_id"] == 3 and st.job(9)["spec"] == {"command": ["true"]}


def test_reports_survive_reopening_until_marked_sent(tmp_path):
    st = State(tmp_path / "s.db")
    st.report(trade_id=1, job_id=1, kind="event", body={"event": "started"})
    st.close()
    st = State(tmp_path / "s.db")
    (pending,) = st.pending_reports()
    assert pending["body"] == {"event": "started"}
    st.report_done(pending["id"])
    assert st.pending_reports() == []


def test_file_input_is_fetched_and_checked(tmp_path):
    src = tmp_path / "data.bin"
    src.write_bytes(b"weights")
    good = hashlib.sha256(b"weights").hexdigest()
    (path,) = fetch_inputs([{"url": src.as_uri(), "sha256": good, "path": "in/w.bin"}], tmp_path / "job")
    assert path.read_bytes() == b"weights"
    with pytest.raises(InputError, match="sha256"):
        fetch_inputs([{"url": src.as_uri(), "sha256": "0" * 64, "path": "x.bin"}], tmp_path / "job")
    assert not (tmp_path / "job" / "x.bin").exists()


def test_http_input_is_downloaded_with_a_progress_bar(tmp_path):
    import http.server
    import threading

    from rich.progress import Progress

    body = b"x" * 100_000

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Progress(disable=True) as progress:
            (path,) = fetch_inputs([{"url": f"http://127.0.0.1:{server.server_port}/d.bin", "sha256": hashlib.sha256(body).hexdigest()}], tmp_path, progress=progress)
        assert path.name == "d.bin" and path.stat().st_size == 100_000
    finally:
        server.shutdown()


def test_checkpoint_packs_and_unpacks_with_a_stable_digest(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step").write_text("41")
    a = pack_checkpoint(tmp_path / "ck", tmp_path / "a.tar")
    b = pack_checkpoint(tmp_path / "ck", tmp_path / "b.tar")
    assert a["sha256"] == b["sha256"] and a["size"] > 0
    unpack_checkpoint(tmp_path / "a.tar", tmp_path / "out")
    assert (tmp_path / "out" / "step").read_text() == "41"
    (tmp_path / "empty").mkdir()
    assert pack_checkpoint(tmp_path / "empty", tmp_path / "c.tar") is None
