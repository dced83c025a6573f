"""The balancer's load agent (gateway/lb_agent.py) on its own: the weight it reports, and its TCP answer as
HAProxy's agent check reads it (one line per connection). The whole path, HAProxy applying the weights to
two real replicas, is in tests/gateway/test_balancer.py."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import server_config
from gateway.lb_agent import LoadAgent, weight_percent
from infercept.pg_local import free_port


def test_the_weight_is_the_smaller_share_of_room_between_kv_and_sessions() -> None:
    assert weight_percent(100, 100, 0, 256) == 100  # empty
    assert weight_percent(25, 100, 0, 256) == 25  # the KV cache three quarters full
    assert weight_percent(100, 100, 192, 256) == 25  # three quarters of max_sessions in memory
    assert weight_percent(50, 100, 192, 256) == 25 and weight_percent(10, 100, 128, 256) == 10
    assert weight_percent(0, 100, 256, 256) == 1  # full: 1, not 0 (0 is for a draining replica)
    assert weight_percent(None, None, 64, 256) == 75  # the engine did not answer: the sessions alone
    assert weight_percent(0, 0, 0, 256) == 100  # no blocks reported: the sessions alone


async def read_line(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return (await asyncio.wait_for(reader.read(), 5)).decode()
    finally:
        writer.close()


async def test_the_agent_answers_one_line_per_connection_and_weight_0_while_draining() -> None:
    draining = False
    free = 300

    async def blocks() -> tuple[int, int] | None:
        return free, 400

    async def slow_blocks() -> tuple[int, int] | None:
        await asyncio.sleep(10)
        return 0, 400

    agent = LoadAgent(lambda: draining, blocks, lambda: 16, max_sessions=64)
    port = free_port()
    async with agent.serving("127.0.0.1", port):
        assert await read_line(port) == "up 75%\n"
        free = 40
        assert await read_line(port) == "up 10%\n"
        draining = True
        assert await read_line(port) == "0%\n"  # no new sessions (not `drain`: see gateway/lb_agent.py)
    # An engine that does not answer in time: the sessions' share, within the check's timeout.
    slow = LoadAgent(lambda: False, slow_blocks, lambda: 16, max_sessions=64)
    async with slow.serving("127.0.0.1", port):
        assert await asyncio.wait_for(read_line(port), 3) == "up 75%\n"


def test_server_agent_port_is_checked() -> None:
    assert server_config({"agent_port": 9101}).agent_port == 9101 and server_config({}).agent_port is None
    for bad in (0, -1, 70000, "9101", 8000):
        with pytest.raises(ValueError):
            server_config({"agent_port": bad, "port": 8000})
