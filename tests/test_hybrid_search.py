"""Hybrid search end to end (issue 41): `python -m service` with the real default model, a collection with a
lexical index; an exact rare term that the dense ranking misses is found by lexical and hybrid search, and
after kill -9 of the whole service, in the middle of a stream of writes, the restarted one (the log's replay)
ranks every search as before (scores may differ a little after deletes: service/index/lexical.py) and finds
every acknowledged document by its words."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServiceProcess, wait_until

TICKETS = {
    "jam": "The copier on floor 3 keeps jamming paper",
    "toner": "Toner cartridge of the laser printers is empty",
    "driver": "Printing fails after the driver update",
    "offline": "The office printers go offline every morning",
    "spool": "Print spooler crashed and nothing prints",
    "wifi": "Wireless printers cannot join the office network",
    "coffee": "Reordered part QX9981 for the coffee machine in the lobby",
    "lunch": "Team lunch moved to Friday at noon",
}
QUERY = "printer error QX9981"  # the part number, and "printer" (stemmed: the tickets naming "printers")


def children(pid: int) -> list[int]:
    """The service's processes under `pid` (engine, index, API), from /proc."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out + [g for c in out for g in children(c)]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie holds no file open


@pytest.fixture(scope="module")
def service_env(default_export, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid")
    return {"SEMBED_MODELS": f"minilm={default_export}", "SEMBED_INDEX_PATH": str(folder / "index")}, folder


def test_a_rare_term_dense_search_misses_is_found_lexically_and_survives_kill_9(service_env):
    env, folder = service_env
    with ServiceProcess(env, folder / "first.log") as service, \
            httpx.Client(base_url=service.url, timeout=60) as c:
        created = c.post("/collections", json={"name": "tickets", "lexical": True})
        assert created.status_code == 201 and created.json()["lexical"] is True, created.text
        documents = [{"id": i, "text": t, "metadata": {"team": "facilities" if i in ("coffee", "lunch") else "it"}}
                     for i, t in TICKETS.items()]
        assert c.post("/collections/tickets/documents", json={"documents": documents}).status_code == 200

        def top(mode: str, query: str = QUERY, **body) -> list[str]:
            reply = c.post("/collections/tickets/search", json={"query": query, "k": 1, "mode": mode, **body})
            assert reply.status_code == 200, reply.text
            return [h["id"] for h in reply.json()["results"][0]]

        assert top("dense") != ["coffee"]  # the printer tickets are nearer in meaning
        assert top("lexical") == top("hybrid") == ["coffee"]
        assert top("hybrid", filter={"team": "it"}) != ["coffee"]  # filters apply in every mode
        assert top("lexical", filter={"team": "it"}) in (["toner"], ["offline"], ["wifi"])  # "printers"
        assert top("lexical", "coffee", filter={"team": "it"}) == []

        # deletes and replaces change the lexical statistics: the restarted service must rank the same
        assert c.delete("/collections/tickets/documents/lunch").status_code == 200
        replaced = {"id": "spool", "text": "Print spooler QX9981 module replaced, printing works", "metadata": {}}
        acked = c.post("/collections/tickets/documents", json={"documents": [replaced]})
        assert acked.status_code == 200

        def answers() -> list:
            out = []
            for body in ({"query": QUERY, "mode": "lexical"}, {"query": QUERY, "mode": "hybrid"},
                         {"query": "printers offline", "mode": "lexical"},
                         {"query": [QUERY, "coffee machine"], "mode": "hybrid", "fusion": {"k": 5}}):
                reply = c.post("/collections/tickets/search", json={"k": 5, "include": [], **body})
                out.append([[h["id"] for h in row] for row in reply.json()["results"]])
            return out

        before = answers()
        assert set(before[0][0][:2]) == {"coffee", "spool"}  # the two tickets naming the part first

        # a writer streams documents into another lexical collection, each with a word of its own
        assert c.post("/collections", json={"name": "stream", "lexical": True}).status_code == 201
        acknowledged: list[str] = []
        stop = threading.Event()

        def writer() -> None:
            with httpx.Client(base_url=service.url, timeout=30) as w:
                n = 0
                while not stop.is_set():
                    batch = [{"id": f"d{n + j}", "text": f"note {n + j} mentions w{n + j}x only"} for j in range(3)]
                    n += len(batch)
                    try:
                        reply = w.post("/collections/stream/documents", json={"documents": batch})
                    except httpx.HTTPError:  # killed mid-request: unknown whether it was written
                        return
                    if reply.status_code == 200:
                        acknowledged.extend(d["id"] for d in batch)

        thread = threading.Thread(target=writer)
        thread.start()
        wait_until(lambda: len(acknowledged) >= 30, 120, what="30 acknowledged documents")
        processes = [service.proc.pid, *children(service.proc.pid)]
        os.kill(service.proc.pid, signal.SIGKILL)  # the supervisor: its children die with it (PR_SET_PDEATHSIG)
        stop.set()
        thread.join(timeout=60)
        wait_until(lambda: all(gone(p) for p in processes), 60, what="every process of the killed service to end")

    with ServiceProcess(env, folder / "second.log") as service, \
            httpx.Client(base_url=service.url, timeout=60) as c:
        info = c.get("/collections/tickets").json()
        assert info["lexical"] is True and info["count"] == len(TICKETS) - 1
        assert info["sequence"] == acked.json()["sequence"]  # every acknowledged write is back
        assert answers() == before
        # every acknowledged document of the stream is found by its own word, lexically (k = 1: and first)
        assert c.get("/collections/stream").json()["count"] >= len(acknowledged)
        for start in range(0, len(acknowledged), 64):
            part = acknowledged[start: start + 64]
            reply = c.post("/collections/stream/search", json={"query": [f"w{i[1:]}x" for i in part], "k": 1,
                                                               "mode": "lexical", "include": []})
            assert [[h["id"] for h in row] for row in reply.json()["results"]] == [[i] for i in part]


def test_the_default_collection_with_sembed_index_lexical(service_env):
    """SEMBED_INDEX_LEXICAL=true through the real processes (the index process makes the default collection
    lexical): /search ranks by words and fuses; restarted without it, /search refuses those modes by name."""
    env, folder = service_env
    env = {**env, "SEMBED_INDEX_PATH": str(folder / "default-index")}
    documents = [{"id": i, "text": t} for i, t in TICKETS.items()]
    with ServiceProcess({**env, "SEMBED_INDEX_LEXICAL": "true"}, folder / "default.log") as service, \
            httpx.Client(base_url=service.url, timeout=60) as c:
        assert c.get("/collections/default").json()["lexical"] is True
        assert c.post("/index/documents", json={"documents": documents}).status_code == 200
        for mode in ("lexical", "hybrid"):
            reply = c.post("/search", json={"query": QUERY, "k": 1, "mode": mode, "fusion": {"k": 10}}
                           if mode == "hybrid" else {"query": QUERY, "k": 1, "mode": mode})
            assert [h["id"] for h in reply.json()["results"][0]] == ["coffee"], reply.text
    with ServiceProcess(env, folder / "default-off.log") as service, \
            httpx.Client(base_url=service.url, timeout=60) as c:
        assert c.get("/collections/default").json()["lexical"] is False
        reply = c.post("/search", json={"query": QUERY, "mode": "lexical"})
        assert reply.status_code == 422 and "SEMBED_INDEX_LEXICAL=true" in reply.json()["error"], reply.text
        assert c.post("/search", json={"query": QUERY}).json()["results"][0]  # dense: every document still there
