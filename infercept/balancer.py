"""The HAProxy configuration in front of gateway replicas (`infercept cluster` writes and runs it; the
example in examples/replicas/haproxy.cfg is its output for two replicas).

How it routes:
* `POST /v1/sessions` (a new session) and everything that is not a session's (health, models, chat
  completions) go to the least loaded healthy replica (`leastconn`).
* New sessions are weighted by each replica's room: its load agent (`server.agent_port`,
  gateway/lb_agent.py) reports the smaller of its free KV share and its room under `max_sessions` every
  second (`agent-check`), or weight 0 while it drains; `leastconn` then counts connections per unit of weight.
* A new session's replica is learned from its creation's response (`X-Infercept-Session`) into a stick
  table, so every later request of that session (`/v1/sessions/<id>/...`) reaches its owner.
* A session the table does not know (the balancer restarted, another balancer created it) is sent by a
  consistent hash of its path to one replica, and the replicas forward it to the owner if that is not it
  (one hop; gateway/replicas.py); a stuck replica that is down is skipped, and the replica that gets the
  request takes the session over once the owner's lease lapses.
* Health: `GET /healthz` every second; a replica answering anything but 200 (starting, draining, its
  engine restarting) gets no new requests. Streams (SSE turns) may stay open for an hour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SESSION_HEADER = "X-Infercept-Session"  # gateway/routes_sessions.py sets it on a new session's response


@dataclass(frozen=True)
class Backend:
    name: str  # the replica id
    host: str
    port: int
    agent_port: int | None = None  # its load agent (server.agent_port); None: weighted by connections only


def _errors() -> str:
    lines = []
    for status, kind in ((502, "bad_gateway"), (503, "no_replica"), (504, "gateway_timeout")):
        body = ('{"error": {"type": "%s", "message": "no gateway replica could answer this request now; retry '
                'shortly"}}' % kind)
        lines.append(f"    http-error status {status} content-type application/json string '{body}' hdr Retry-After 2")
    return "\n".join(lines)


def haproxy_config(replicas: Sequence[Backend], *, bind_host: str = "127.0.0.1", bind_port: int = 8000,
                   stats_port: int | None = None, maxconn: int = 20000) -> str:
    if not replicas:
        raise ValueError("a balancer needs at least one replica")

    def servers(agent: bool = False) -> str:
        # The same server ids in both backends: the stick table stores a server by its id. New sessions'
        # backend reads each replica's load agent, where it has one.
        def extra(r: Backend) -> str:
            # weight 100: the agent's percentage applies to it (of the default weight 1, every share rounds to 1)
            return (f" weight 100 agent-check agent-addr {r.host} agent-port {r.agent_port} agent-inter 1s"
                    if agent and r.agent_port else "")

        return "\n".join(f"    server {r.name} {r.host}:{r.port} id {i} check inter 1s fall 2 rise 1{extra(r)}"
                         for i, r in enumerate(replicas, 1))

    stats = (f"\nfrontend stats\n    bind {bind_host}:{stats_port}\n    stats enable\n    stats uri /\n"
             if stats_port is not None else "")
    return f"""# Written by infercept (infercept/balancer.py): HAProxy in front of {len(replicas)} gateway replicas.
global
    maxconn {maxconn}
    log stdout format raw local0 notice

defaults
    mode http
    log global
    option httplog
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    timeout http-request 30s
    timeout http-keep-alive 30s
    # A replica that refuses the connection (dead, not yet marked down): the request goes to another
    # one, which forwards it or takes the session over.
    retries 2
    option redispatch
    # The balancer's own errors in the gateway's form, with the Retry-After clients already honour.
{_errors()}

frontend infercept
    bind {bind_host}:{bind_port}
    acl session_path path_beg /v1/sessions/
    use_backend sessions if session_path
    default_backend new_sessions

backend sessions
    # A session's owner, learned when it was created; else one replica by a hash of /v1/sessions/<id>.
    stick-table type string len 64 size 1m expire 24h
    stick on path,field(4,/)
    balance uri depth 3
    hash-type consistent
    option httpchk GET /healthz
    http-check expect status 200
{servers()}

backend new_sessions
    balance leastconn
    stick store-response res.hdr({SESSION_HEADER}) table sessions
    option httpchk GET /healthz
    http-check expect status 200
{servers(agent=True)}
{stats}"""


__all__ = ["Backend", "SESSION_HEADER", "haproxy_config"]
