"""Kamailio in front of several agent workers: `callcenter kamailio-config` writes a kamailio.cfg and
a dispatcher list. Kamailio's dispatcher module spreads new INVITEs round-robin over the workers,
pings them with OPTIONS (a silent worker is taken out within a few seconds and put back when it
answers again) and, when a worker times out or answers 5xx or 486 (all its call slots busy), tries
the next one. It record-routes INVITEs, so ACK and BYE of a call follow the call to its worker.

With callers' credentials (`--caller USER=ENV_VAR`) Kamailio also asks every INVITE for digest
authentication (407): missing credentials are challenged, wrong ones get 403 Forbidden, and only
authenticated INVITEs reach a worker. pjsua2 cannot challenge incoming INVITEs itself, so the
balancer is where this belongs. The passwords (from the environment, at generation time) sit in an
in-memory table of the generated config, which is written with mode 600.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from callcenter.store.url import StoreUrl

DISPATCHER_SET = 1
AGENT_HEADER = "X-Callcenter-Agent"  # the agent Kamailio authenticated; workers take it from trusted proxies only
PIKE_DENSITY = 40  # requests per PIKE_UNIT_S from one address (not a worker) before it is blocked
PIKE_UNIT_S = 2
NO_ANSWER_MS = 2000  # a worker that has not answered an INVITE (not even 100 Trying) by then is skipped
MODULE_DIRS = ("/usr/lib/x86_64-linux-gnu/kamailio/modules", "/usr/lib/aarch64-linux-gnu/kamailio/modules",
               "/usr/lib/kamailio/modules", "/usr/local/lib64/kamailio/modules")

CONFIG = """#!KAMAILIO
# Written by `callcenter kamailio-config`: a stateful SIP load balancer for callcenter workers.
debug=2
log_stderror=yes
fork=yes
children={children}
auto_aliases=no
listen=udp:{listen}
mpath="{mpath}"

loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "pv.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "siputils.so"
loadmodule "xlog.so"
loadmodule "sanity.so"
loadmodule "dispatcher.so"
loadmodule "dialog.so"
loadmodule "pike.so"
{auth_modules}
modparam("tm", "fr_timer", {no_answer_ms})
modparam("tm", "fr_inv_timer", 60000)
{dispatcher_source}
modparam("dispatcher", "flags", 2)   # failover support: ds_next_dst() after a failure
modparam("dispatcher", "ds_ping_interval", 2)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_probing_threshold", 1)
modparam("dispatcher", "ds_inactive_threshold", 1)
modparam("dispatcher", "ds_ping_from", "sip:balancer@{listen}")
# every call Kamailio sets up is a tracked dialog; in-dialog requests must belong to one of them
modparam("dialog", "dlg_match_mode", 1)
modparam("dialog", "default_timeout", 43200)
# requests per source address: more than {pike_density} in {pike_unit} s blocks that address for a while
modparam("pike", "sampling_time_unit", {pike_unit})
modparam("pike", "reqs_density_per_unit", {pike_density})
modparam("pike", "remove_latency", 4)

request_route {{
    if (!mf_process_maxfwd_header("10")) {{
        sl_send_reply("483", "Too Many Hops");
        exit;
    }}
    if (!sanity_check("1511", "7")) {{
        xlog("L_WARN", "malformed request from $si:$sp dropped\\n");
        exit;
    }}
    if (!ds_is_from_list("{dset}") && !pike_check_req()) {{
        # a flood from one address (the workers themselves are never limited): dropped unanswered
        xlog("L_WARN", "rate limit: $rm from $si:$sp dropped\n");
        exit;
    }}
    if (!ds_is_from_list("{dset}") && search("{agent_header}")) {{
        # only this balancer names an agent to a worker: a request that names one itself, in any
        # form (folded onto another header's line, any case), is an impostor
        xlog("L_WARN", "$rm from $si:$sp carries {agent_header} itself: refused\n");
        if (!is_method("ACK")) sl_send_reply("403", "Forbidden");
        exit;
    }}
    if (has_totag()) {{
        # in-dialog requests (ACK, BYE, re-INVITE) follow the Record-Route to the call's worker, but
        # only within a dialog this balancer set up itself, and only between its caller and a
        # worker: a made-up To-tag and Route must not turn Kamailio into an open relay
        if (!is_known_dlg()) {{
            xlog("L_WARN", "in-dialog $rm from $si:$sp to $ru matches no dialog of ours: refused\n");
            if (!is_method("ACK")) sl_send_reply("403", "Forbidden");
            exit;
        }}
        if (loose_route()) {{
            if ($hdrc(Route) > 1 || $(hdr(Route){{s.count,,}}) > 0) {{
                # a Route the caller added after ours: following it would relay the request
                # (from this balancer's address) wherever the caller chose
                xlog("L_WARN", "in-dialog $rm from $si:$sp carries a Route beyond ours: refused\n");
                if (!is_method("ACK")) sl_send_reply("403", "Forbidden");
                exit;
            }}
            if (!ds_is_from_list("{dset}") && !ds_is_from_list("{dset}", "2", "$ru")) {{
                xlog("L_WARN", "in-dialog $rm from $si:$sp to $ru: neither side is a worker, refused\n");
                if (!is_method("ACK")) sl_send_reply("403", "Forbidden");
                exit;
            }}
            t_relay();
            exit;
        }}
        if (is_method("ACK")) {{
            if (t_check_trans()) t_relay();
            exit;
        }}
        sl_send_reply("404", "Not here");
        exit;
    }}
    if (is_method("CANCEL")) {{
        if (t_check_trans()) t_relay();
        exit;
    }}
{registrar_block}    if (!is_method("INVITE|OPTIONS")) {{
        sl_send_reply("405", "Method Not Allowed");
        exit;
    }}
    if (is_method("OPTIONS") && uri == myself) {{
        sl_send_reply("200", "OK");
        exit;
    }}
{auth_block}    t_check_trans();
    if (is_method("INVITE")) dlg_manage();
    record_route();
    if (!ds_select_dst("{dset}", "4")) {{   # 4: round-robin over the workers that are up
        sl_send_reply("503", "No agent available");
        exit;
    }}
    t_on_failure("NEXT_WORKER");
    if (!t_relay()) sl_reply_error();
    exit;
}}

{registrar_route}{auth_events}{db_routes}failure_route[NEXT_WORKER] {{
    if (t_is_canceled()) exit;
    if (t_check_status("408|486|5[0-9][0-9]")) {{
        if (t_check_status("408|5[0-9][0-9]")) ds_mark_dst("ip");   # down: out until it answers OPTIONS
        if (ds_next_dst()) {{
            t_on_failure("NEXT_WORKER");
            t_relay();
            exit;
        }}
    }}
}}
"""


def module_dir() -> str:
    for d in MODULE_DIRS:
        if (Path(d) / "dispatcher.so").exists():
            return d
    return MODULE_DIRS[0]


HT_AUTH_MODULES = """loadmodule "htable.so"
modparam("htable", "htable", "callers=>size=8;")
modparam("htable", "htable", "agents=>size=8;")
"""
# Kamailio on the store's PostgreSQL: callers and agents in tables (HA1 only, never a password),
# registrations written through to `location` (a restart loses none), the workers in `dispatcher`
# (re-read every DS_RELOAD_S: a worker on a new host joins by a row)
DB_MODULES = """loadmodule "db_postgres.so"
loadmodule "auth_db.so"
loadmodule "sqlops.so"
loadmodule "rtimer.so"
modparam("auth_db", "db_url", "{db_url}")
modparam("auth_db", "calculate_ha1", 0)
modparam("auth_db", "password_column", "ha1")
modparam("sqlops", "sqlcon", "cc=>{db_url}")
modparam("rtimer", "timer", "name=workers;interval={reload_s};mode=1;")
modparam("rtimer", "exec", "timer=workers;route=RELOAD_WORKERS")
"""
DB_ROUTES = """route[RELOAD_WORKERS] {
    ds_reload();
}

"""
DS_RELOAD_S = 10
AUTH_MODULES = """loadmodule "auth.so"
# challenges carry qop=auth; each nonce is good for one request (nonce-count tracked for qop), and
# only from the address, for the Call-ID and Request-URI it was issued to: a captured REGISTER or
# keypad-code INVITE cannot be replayed, from another address or at all
modparam("auth", "qop", "auth")
modparam("auth", "nonce_count", 1)
modparam("auth", "one_time_nonce", 1)
modparam("auth", "auth_checks_register", {auth_checks})
modparam("auth", "auth_checks_no_dlg", {auth_checks})
"""
AUTH_CHECKS = 1 | 2 | 8  # the nonce is bound to the full Request-URI, the Call-ID and the source IP
CHALLENGE_QOP = "1"  # auth_challenge / www_challenge flags: qop=auth

AUTH_BLOCK = """    if (is_method("INVITE")) {{
        # digest authentication of callers: challenge, refuse unknown users and wrong credentials,
        # consume good ones
        if (!is_present_hf("Proxy-Authorization") || $au == $null || $au == "") {{
            auth_challenge("{realm}", "{qop}");
            exit;
        }}
{check_caller}        if ($var(rc) == -5 || $var(rc) == -4 || $var(rc) == -6) {{   # none yet, stale or foreign nonce
            auth_challenge("{realm}", "{qop}");
            exit;
        }}
        if ($var(rc) < 0) {{   # wrong password, unknown user, malformed credentials
            xlog("L_WARN", "authentication failed for '$au' from $si:$sp ($var(rc))\\n");
            sl_send_reply("403", "Forbidden");
            exit;
        }}
        consume_credentials();
    }}
"""

# how a user's credentials are checked: against the passwords in the config (an htable), or against
# PostgreSQL (auth_db: the `subscriber` table for callers, AGENTS_TABLE for agents, HA1 only)
HT_CHECK = """        if ($sht({table}=>$au) == $null) {{
            # an unknown user must never reach pv_auth_check: $null stored in a $var is the integer 0,
            # so the password "0" would pass
            xlog("L_WARN", "authentication failed for unknown user '$au' from $si:$sp\\n");
            sl_send_reply("403", "Forbidden");
            exit;
        }}
        $var(password) = $sht({table}=>$au);
        $var(rc) = {check}("{realm}", "$var(password)", "0"{extra});
"""
DB_CHECK = """        $var(rc) = {check}("{realm}", "{table}");
"""
HT_IS_AGENT = """    $var(is_agent) = 0;
    if ($sht(agents=>$rU) != $null) $var(is_agent) = 1;
"""
DB_IS_AGENT = """    $var(is_agent) = 0;
    if (is_method("INVITE") && ds_is_from_list("{dset}")) {{
        if (sql_query("cc", "SELECT 1 FROM {table} WHERE username=$(rU{{sql.val}})", "agent") == 1
                && $dbr(agent=>rows) > 0) $var(is_agent) = 1;
        sql_result_free("agent");
    }}
"""
AGENTS_TABLE = "callcenter_agents"  # Kamailio's subscriber schema, for the agents' phones


def _checks(db: bool, realm: str) -> dict[str, str]:
    """The credential checks of one flavour, as finished script text (the templates insert them
    as they are)."""
    if db:
        return {"check_caller": DB_CHECK.format(check="proxy_authenticate", table="subscriber", realm=realm),
                "check_agent": DB_CHECK.format(check="proxy_authenticate", table=AGENTS_TABLE, realm=realm),
                "check_registrant": _dedent(DB_CHECK.format(check="www_authenticate", table=AGENTS_TABLE,
                                                            realm=realm)),
                "is_agent": DB_IS_AGENT.format(table=AGENTS_TABLE, dset=DISPATCHER_SET)}
    return {"check_caller": HT_CHECK.format(table="callers", check="pv_auth_check", extra=', "0"', realm=realm),
            "check_agent": HT_CHECK.format(table="agents", check="pv_auth_check", extra=', "0"', realm=realm),
            "check_registrant": _dedent(HT_CHECK.format(table="agents", check="pv_www_authenticate", extra="",
                                                        realm=realm)),
            "is_agent": HT_IS_AGENT}


def _dedent(block: str) -> str:
    return "".join(line[4:] if line.startswith("    ") else line for line in block.splitlines(True))


REGISTRAR_MODULES = """loadmodule "usrloc.so"
loadmodule "registrar.so"
loadmodule "ipops.so"
{usrloc}
modparam("registrar", "max_expires", 3600)
# one phone per agent: a queue call rings one place, never a list the agent (or a thief) wrote
modparam("registrar", "max_contacts", 1)
"""

# human agents' softphones register here (digest-authenticated, each only as themselves); workers
# ring an agent at sip:<name>@<this balancer>, which reaches the phone where it registered
REGISTRAR_BLOCK = """    if (is_method("REGISTER")) {{
        route(REGISTRAR);
        exit;
    }}
    if (is_method("INVITE") && !ds_is_from_list("{dset}") && $rU =~ "^[*][0-9]+$") {{
        # an agent's keypad code from their phone (*41 log in, *42 log out, *45 pause, *46 resume):
        # the agent proves who they are, and the worker is told in X-Callcenter-Agent
        if (!is_present_hf("Proxy-Authorization") || $au == $null || $au == "") {{
            auth_challenge("{realm}", "{qop}");
            exit;
        }}
{check_agent}        if ($var(rc) == -5 || $var(rc) == -4 || $var(rc) == -6) {{
            auth_challenge("{realm}", "{qop}");
            exit;
        }}
        if ($var(rc) < 0) {{
            sl_send_reply("403", "Forbidden");
            exit;
        }}
        consume_credentials();
        append_hf("{agent_header}: $au\r\n");
        t_check_trans();
        dlg_manage();
        record_route();
        if (!ds_select_dst("{dset}", "4")) {{
            sl_send_reply("503", "No agent available");
            exit;
        }}
        t_on_failure("NEXT_WORKER");
        if (!t_relay()) sl_reply_error();
        exit;
    }}
{is_agent}    if (is_method("INVITE") && ds_is_from_list("{dset}") && $var(is_agent) == 1) {{
        # a worker rings a human agent of a queue
        if (!lookup("location")) {{
            sl_send_reply("480", "Agent Not Registered");
            exit;
        }}
        t_check_trans();
        dlg_manage();
        record_route();
        if (!t_relay()) sl_reply_error();
        exit;
    }}
    if (is_method("INVITE") && ds_is_from_list("{dset}")) {{
        # a worker calls through the balancer only to reach an agent: anyone else is not one of
        # ours (an agent missing from --agent), and must never loop back to a worker as a caller
        xlog("L_WARN", "worker $si:$sp called $ru, not a registered agent of this balancer\n");
        sl_send_reply("404", "Not An Agent Here");
        exit;
    }}
"""

REGISTRAR_ROUTE = """route[REGISTRAR] {{
    if (!is_present_hf("Authorization") || $au == $null || $au == "") {{
        www_challenge("{realm}", "{qop}");
        exit;
    }}
    if ($au != $tU) {{
        xlog("L_WARN", "registration refused for '$au' as '$tU' from $si:$sp\n");
        sl_send_reply("403", "Forbidden");
        exit;
    }}
{check_registrant}    if ($var(rc) == -5 || $var(rc) == -4 || $var(rc) == -6) {{
        www_challenge("{realm}", "{qop}");
        exit;
    }}
    if ($var(rc) < 0) {{
        xlog("L_WARN", "registration of '$au' from $si:$sp failed ($var(rc))\n");
        sl_send_reply("403", "Forbidden");
        exit;
    }}
    consume_credentials();
    if ($ct != "*" && $ct != $null) {{
        # the phone registers itself, where it is: one Contact, at the address the REGISTER came
        # from (or in an agents' network), so a queue call can never be sent to a gateway or a
        # premium number of the registrant's choosing
        $var(chost) = $(ct{{nameaddr.uri}}{{uri.host}});
        if ($hdrc(Contact) != 1 || $(ct{{s.count,,}}) > 0 || ($var(chost) != $si{agent_networks})) {{
            xlog("L_WARN", "registration of '$au' from $si:$sp refused: contact $ct is not the sender\n");
            sl_send_reply("403", "Contact Must Be The Sender");
            exit;
        }}
    }}
    if (!save("location", "0x04")) sl_reply_error();   # 0x04: the new contact replaces the old
}}

"""

def _network(net: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(net, strict=False))
    except ValueError:
        raise ValueError(f"agent network {net!r} is not a network (10.20.0.0/16)") from None


USER = re.compile(r"^[A-Za-z0-9._+-]{1,64}$")


def _auth_events(tables: dict[str, dict[str, str]]) -> str:
    """The passwords of each table (callers, agents), loaded when the htable module starts."""
    lines = []
    for table, users in tables.items():
        for user, password in users.items():
            if not USER.match(user):
                raise ValueError(f"{table[:-1]} name {user!r}: letters, digits and . _ + - only")
            if not password or any(c in password for c in '"\\\n\r$'):
                raise ValueError(f"the password of {user!r} is empty or has a quote, backslash, $ or newline")
            lines.append(f'    $sht({table}=>{user}) = "{password}";\n')
    return "event_route[htable:mod-init] {\n" + "".join(lines) + "}\n\n"


def callers_from_env(specs: list[str], option: str = "--caller") -> dict[str, str]:
    """["alice=ALICE_PASSWORD", ...] → {"alice": <$ALICE_PASSWORD>}."""
    out = {}
    for spec in specs:
        user, sep, env = spec.partition("=")
        if not sep or not env:
            raise ValueError(f"{option} {spec!r}: expected USER=ENV_VAR (the password's environment variable)")
        if env not in os.environ:
            raise ValueError(f"{option} {spec!r}: environment variable {env} is not set")
        out[user] = os.environ[env]
    return out


def write_kamailio_config(out_dir: str | Path, listen: str, workers: list[str], children: int = 4,
                          callers: dict[str, str] | None = None, realm: str = "callcenter",
                          pike_density: int = PIKE_DENSITY, pike_unit_s: int = PIKE_UNIT_S,
                          agents: dict[str, str] | None = None, agent_networks: list[str] | None = None,
                          db: StoreUrl | None = None) -> Path:
    """`workers`: SIP URIs (sip:127.0.0.1:5070); `callers`: user → password for digest
    authentication of INVITEs (none: no authentication); `agents`: human agents (user → password)
    whose softphones register here and whom workers ring (none: no registrar); `pike_density`:
    requests one source address may send per `pike_unit_s` seconds before it is blocked. Returns
    the path of kamailio.cfg. `agent_networks`: networks (CIDR) an agent's phone may register a
    contact in besides its own source address (phones behind a NAT or a PBX). `db`: the store's
    PostgreSQL, where Kamailio keeps callers, agents, registrations and the workers (the tables are
    made and filled here: `provision_kamailio_db`); without it, all of that is in the config and in
    Kamailio's memory."""
    nets = "".join(f' && !is_in_subnet("$var(chost)", "{_network(n)}")' for n in agent_networks or [])
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workers = [uri if uri.startswith("sip:") else "sip:" + uri for uri in workers]
    if db is not None:
        if db.scheme != "postgresql":
            raise ValueError(f"Kamailio keeps its tables in PostgreSQL, not {db.display}")
        provision_kamailio_db(db, workers, callers or {}, agents or {}, realm)
        db_url = kamailio_db_url(db)
        dispatcher_source = f'modparam("dispatcher", "db_url", "{db_url}")'
    else:
        dispatcher = out / "dispatcher.list"
        dispatcher.write_text("# set destination flags priority attributes\n" + "".join(
            f"{DISPATCHER_SET} {uri} 0 {len(workers) - i}\n" for i, uri in enumerate(workers)))
        dispatcher_source = f'modparam("dispatcher", "list_file", "{dispatcher}")'
    cfg = out / "kamailio.cfg"
    auth = {"realm": realm, "qop": CHALLENGE_QOP, **_checks(db is not None, realm)}
    usrloc = (f'modparam("usrloc", "db_url", "{kamailio_db_url(db)}")\nmodparam("usrloc", "db_mode", 1)'
              if db is not None else 'modparam("usrloc", "db_mode", 0)')
    modules = ""
    if callers or agents:
        modules = AUTH_MODULES.format(auth_checks=AUTH_CHECKS)
        modules += DB_MODULES.format(db_url=kamailio_db_url(db), reload_s=DS_RELOAD_S) if db else HT_AUTH_MODULES
    if agents:
        modules += REGISTRAR_MODULES.format(usrloc=usrloc)
    text = CONFIG.format(children=children, listen=listen, mpath=module_dir(), agent_header=AGENT_HEADER,
                         no_answer_ms=NO_ANSWER_MS, pike_density=pike_density, pike_unit=pike_unit_s,
                         dispatcher_source=dispatcher_source, dset=DISPATCHER_SET, auth_modules=modules,
                         auth_block=AUTH_BLOCK.format(**auth) if callers else "",
                         registrar_block=REGISTRAR_BLOCK.format(dset=DISPATCHER_SET, agent_header=AGENT_HEADER, **auth)
                         if agents else "",
                         registrar_route=REGISTRAR_ROUTE.format(agent_networks=nets, **auth) if agents else "",
                         auth_events=_auth_events({"callers": callers or {}, "agents": agents or {}})
                         if (callers or agents) and db is None else "",
                         db_routes=DB_ROUTES if db is not None and (callers or agents) else "")
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(cfg, 0o600)
    return cfg


KAMAILIO_SQL = Path("/usr/share/kamailio/postgres")  # Debian's kamailio-postgres-modules
KAMAILIO_TABLES = (("standard", "version"), ("auth_db", "subscriber"), ("usrloc", "location"),
                   ("dispatcher", "dispatcher"))


def kamailio_db_url(db: StoreUrl) -> str:
    """Kamailio's own form of the store's URL (the password, from the environment, in the config
    file, which is mode 600)."""
    from urllib.parse import quote

    password = db.password()
    auth = quote(db.user, safe="") + (f":{quote(password, safe='')}" if password else "")
    port = f":{db.port}" if db.port else ""
    return f"postgres://{auth}@{db.host}{port}/{db.dbname}"


def provision_kamailio_db(db: StoreUrl, workers: list[str], callers: dict[str, str], agents: dict[str, str],
                          realm: str) -> None:
    """Make Kamailio's tables in the store's database (from Debian's schema files) where they are
    missing, and write the callers' and agents' credentials (HA1 only) and the workers. Rows of
    other users and workers (another host's) are kept."""
    import hashlib

    import psycopg

    for user in [*callers, *agents]:
        if not USER.match(user):
            raise ValueError(f"user name {user!r}: letters, digits and . _ + - only")
    with psycopg.connect(db.conninfo(), autocommit=True) as conn:
        have = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
        for module, table in KAMAILIO_TABLES:
            if table not in have:
                sql = (KAMAILIO_SQL / f"{module}-create.sql").read_text()
                with conn.transaction():
                    conn.execute(sql)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {AGENTS_TABLE} (LIKE subscriber INCLUDING ALL)")
        conn.execute("INSERT INTO version(table_name, table_version) SELECT %s, table_version FROM version "
                     "WHERE table_name = 'subscriber' ON CONFLICT (table_name) DO NOTHING", (AGENTS_TABLE,))
        for table, users in (("subscriber", callers), (AGENTS_TABLE, agents)):
            for user, password in users.items():
                ha1 = hashlib.md5(f"{user}:{realm}:{password}".encode()).hexdigest()
                conn.execute(f"DELETE FROM {table} WHERE username = %s", (user,))
                conn.execute(f"INSERT INTO {table}(username, domain, ha1) VALUES(%s, '', %s)", (user, ha1))
        for i, uri in enumerate(workers):
            conn.execute("DELETE FROM dispatcher WHERE setid = %s AND destination = %s", (DISPATCHER_SET, uri))
            conn.execute("INSERT INTO dispatcher(setid, destination, flags, priority) VALUES(%s, %s, 0, %s)",
                         (DISPATCHER_SET, uri, len(workers) - i))
