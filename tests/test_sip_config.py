import pytest

from callcenter.telephony.config import PJSUA_MAX_CALLS, load_server_config
from callcenter.yamlfile import UserFileError


def test_shipped_configs_load():
    cfg = load_server_config("sip_configs/local.yaml")
    assert (cfg.listen.host, cfg.listen.port, cfg.max_calls) == ("127.0.0.1", 5062, PJSUA_MAX_CALLS)
    reg = load_server_config("sip_configs/registrar-example.yaml").registration
    assert reg.password_env == "CALLCENTER_SIP_PASSWORD"


def test_bad_config_names_line_and_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("listen:\n  host: localhost\n  port: 99999\nmax_calls: 9\n")
    with pytest.raises(UserFileError) as exc:
        load_server_config(p)
    text = str(exc.value)
    assert f"{p}:2:" in text and "listen.host" in text
    assert f"{p}:3:" in text and "listen.port" in text
    assert f"{p}:4:" in text and "max_calls" in text


def test_registration_needs_one_password(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("registration:\n  registrar: sip:pbx.example.com\n  user: u\n")
    with pytest.raises(UserFileError, match="exactly one of password or password_env"):
        load_server_config(p)


def test_missing_config(tmp_path):
    with pytest.raises(UserFileError, match="no such file"):
        load_server_config(tmp_path / "nope.yaml")


def test_acl_allows_listed_addresses_and_networks_only():
    from callcenter.telephony.config import ServerConfig

    config = ServerConfig(acl=["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"])
    assert config.allows("10.20.30.40:5060") and config.allows("192.0.2.7:5062")
    assert config.allows("[2001:db8::5]:5060")
    assert not config.allows("127.0.0.1:5060") and not config.allows("192.0.2.8:5060")
    assert not config.allows("garbage")
    assert ServerConfig().allows("203.0.113.9:5060")  # no acl: anyone may call
    with pytest.raises(ValueError, match="not an address or network"):
        ServerConfig(acl=["10.0.0.0/33"])


def test_workers_share_one_control_token_and_the_console_finds_them(tmp_path, monkeypatch):
    """Workers started together race to create recordings/.control-token: one token wins for all."""
    from concurrent.futures import ThreadPoolExecutor

    from callcenter.supervisor.api import control_token
    from callcenter.telephony.config import Control, load_server_config
    from callcenter.workers import worker_control_urls

    monkeypatch.delenv("CALLCENTER_TOKEN", raising=False)
    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: control_token(Control(), tmp_path), range(8)))
    assert tokens == {(tmp_path / ".control-token").read_text().strip()}
    assert oct((tmp_path / ".control-token").stat().st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob(".control-token.*"))
    cfg = load_server_config("sip_configs/local.yaml")
    assert worker_control_urls(cfg, 3) == ["http://127.0.0.1:8470", "http://127.0.0.1:8471", "http://127.0.0.1:8472"]
