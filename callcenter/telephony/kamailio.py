"""Kamailio in front of several agent workers: `callcenter kamailio-config` writes a kamailio.cfg and
a dispatcher list. Kamailio's dispatcher module spreads new INVITEs round-robin over the workers,
pings them with OPTIONS (a silent worker is taken out within a few seconds and put back when it
answers again) and, when a worker times out or answers 5xx or 486 (all its call slots busy), tries
the next one. It record-routes INVITEs, so ACK and BYE of a call follow the call to its worker.
"""

from __future__ import annotations

from pathlib import Path

DISPATCHER_SET = 1
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

modparam("tm", "fr_timer", {no_answer_ms})
modparam("tm", "fr_inv_timer", 60000)
modparam("dispatcher", "list_file", "{dispatcher_list}")
modparam("dispatcher", "flags", 2)   # failover support: ds_next_dst() after a failure
modparam("dispatcher", "ds_ping_interval", 2)
modparam("dispatcher", "ds_probing_mode", 1)
modparam("dispatcher", "ds_probing_threshold", 1)
modparam("dispatcher", "ds_inactive_threshold", 1)
modparam("dispatcher", "ds_ping_from", "sip:balancer@{listen}")

request_route {{
    if (!mf_process_maxfwd_header("10")) {{
        sl_send_reply("483", "Too Many Hops");
        exit;
    }}
    if (!sanity_check("1511", "7")) {{
        xlog("L_WARN", "malformed request from $si:$sp dropped\\n");
        exit;
    }}
    if (has_totag()) {{
        # in-dialog requests (ACK, BYE, re-INVITE) follow the Record-Route to the call's worker
        if (loose_route()) {{
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
    if (!is_method("INVITE|OPTIONS")) {{
        sl_send_reply("405", "Method Not Allowed");
        exit;
    }}
    if (is_method("OPTIONS") && uri == myself) {{
        sl_send_reply("200", "OK");
        exit;
    }}
    t_check_trans();
    record_route();
    if (!ds_select_dst("{dset}", "4")) {{   # 4: round-robin over the workers that are up
        sl_send_reply("503", "No agent available");
        exit;
    }}
    t_on_failure("NEXT_WORKER");
    if (!t_relay()) sl_reply_error();
    exit;
}}

failure_route[NEXT_WORKER] {{
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


def write_kamailio_config(out_dir: str | Path, listen: str, workers: list[str], children: int = 4) -> Path:
    """`workers`: SIP URIs (sip:127.0.0.1:5070). Returns the path of kamailio.cfg."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dispatcher = out / "dispatcher.list"
    dispatcher.write_text("# set destination flags priority attributes\n" + "".join(
        f"{DISPATCHER_SET} {uri if uri.startswith('sip:') else 'sip:' + uri} 0 {len(workers) - i}\n"
        for i, uri in enumerate(workers)))
    cfg = out / "kamailio.cfg"
    cfg.write_text(CONFIG.format(children=children, listen=listen, mpath=module_dir(),
                                 no_answer_ms=NO_ANSWER_MS, dispatcher_list=dispatcher, dset=DISPATCHER_SET))
    return cfg
