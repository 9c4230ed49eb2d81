import textwrap

import pytest

from callcenter.dialog.flow import load_flow
from callcenter.yamlfile import UserFileError

GOOD = """\
name: t
start: greet
nodes:
  greet:
    type: say
    text: Hello.
    next: menu
  menu:
    type: ask
    prompt: Say yes or press 1.
    on_failure: bye
    intents:
      yes:
        examples: ["yes"]
        keypad: "1"
        next: bye
  bye:
    type: hangup
    text: Bye.
"""


def write(tmp_path, text: str):
    p = tmp_path / "flow.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def problems(tmp_path, text: str) -> list[str]:
    with pytest.raises(UserFileError) as exc:
        load_flow(write(tmp_path, text))
    return exc.value.problems


def test_example_flow_loads(flow):
    assert flow.start == "greet"
    assert {"greet", "main_menu", "billing_answer", "to_operator", "goodbye"} <= set(flow.nodes)


def test_good_flow(tmp_path):
    assert load_flow(write(tmp_path, GOOD)).nodes["menu"].intents["yes"].keypad == "1"


def test_unknown_node_names_file_line_and_field(tmp_path):
    # one typo, one line: the near miss is named, and what it cut off is not reported as unreachable
    ps = problems(tmp_path, GOOD.replace("next: menu", "next: menuu"))
    assert ps == [f"{tmp_path / 'flow.yaml'}:7:5: unknown node 'menuu' (did you mean 'menu'?)"]
    ps = problems(tmp_path, GOOD.replace("next: menu", "next: elsewhere"))
    assert f"{tmp_path / 'flow.yaml'}:7:5: unknown node 'elsewhere'" in ps
    assert any("node 'menu' is unreachable" in p for p in ps)


def test_typo_in_field_name(tmp_path):
    ps = problems(tmp_path, GOOD.replace("    text: Hello.", "    txt: Hello."))
    assert any(":6:5: nodes.greet.txt: unknown key 'txt' (did you mean 'text'?)" in p for p in ps), ps
    assert any(":4:3: nodes.greet.text: Field required" in p for p in ps), ps


def test_missing_field_and_bad_type(tmp_path):
    ps = problems(tmp_path, GOOD.replace("    type: hangup", "    type: hang_up"))
    assert any(":18:5: nodes.bye.type:" in p and "'hang_up'" in p for p in ps), ps


def test_bad_keypad_digit(tmp_path):
    (p,) = problems(tmp_path, GOOD.replace('keypad: "1"', 'keypad: "12"'))
    assert ":15:9: nodes.menu.intents.yes.keypad:" in p


def test_yaml_syntax_error_has_position(tmp_path):
    (p,) = problems(tmp_path, GOOD.replace("text: Hello.", "text: [Hello."))
    assert "invalid YAML" in p and f"{tmp_path / 'flow.yaml'}:" in p


def test_unreachable_and_duplicate_keypad(tmp_path):
    text = GOOD + "  orphan:\n    type: hangup\n"
    text = text.replace('        next: bye\n  bye', '        next: bye\n      no:\n        keypad: "1"\n        next: bye\n  bye')
    ps = problems(tmp_path, text)
    assert any("unreachable" in p and "orphan" in p for p in ps), ps
    assert any("keypad 1 already selects 'yes'" in p for p in ps), ps


def test_transfer_needs_sip_uri(tmp_path):
    text = GOOD.replace("  bye:\n    type: hangup\n    text: Bye.\n", "  bye:\n    type: transfer\n    to: operator\n")
    ps = problems(tmp_path, text)
    assert any(":17:3:" in p or ":19:" in p for p in ps) and any("not a SIP URI" in p for p in ps), ps


def test_missing_file(tmp_path):
    with pytest.raises(UserFileError, match="no such file"):
        load_flow(tmp_path / "nope.yaml")


def test_voices_per_flow_and_per_node(tmp_path):
    text = GOOD.replace("name: t\n", "name: t\nvoice: {name: ssm:slt, speed: 1.1}\nambience: office\n")
    text = text.replace("    text: Bye.\n", "    text: Bye.\n    voice: ssm:awb\n")
    flow = load_flow(write(tmp_path, text))
    assert flow.voice.name == "ssm:slt" and flow.voice.speed == 1.1
    assert flow.nodes["bye"].voice.name == "ssm:awb" and flow.nodes["menu"].voice is None
    assert flow.ambience.preset == "office"
    assert load_flow(write(tmp_path, GOOD)).voice.name == "ssm:heart"


def test_unknown_voice_and_bad_speed_are_located(tmp_path):
    text = GOOD.replace("    text: Bye.\n", "    text: Bye.\n    voice: ssm:nobody\n")
    assert any("flow.yaml:20:5: unknown voice 'ssm:nobody'" in p for p in problems(tmp_path, text))
    text = GOOD.replace("name: t\n", "name: t\nvoice: {name: ssm:joe, speed: 9}\n")
    assert any(":2:" in p and "voice.speed" in p for p in problems(tmp_path, text))
    text = GOOD.replace("name: t\n", "name: t\nambience: disco\n")
    assert any("ambience" in p for p in problems(tmp_path, text))


def test_digits_intent_problems(tmp_path):
    path = write(tmp_path, """
name: t
start: a
nodes:
  a:
    type: ask
    prompt: Account number?
    on_failure: a
    intents:
      number: {digits: {min_length: 9, max_length: 4}, next: a}
      other: {keypad: "1", examples: [other], next: a}
""")
    with pytest.raises(UserFileError) as e:
        load_flow(path)
    text = str(e.value)
    assert "min_length is greater than max_length" in text
    assert "keypad options and a digits intent" in text


def test_fixed_sentences_are_known_before_any_call(flow):
    from callcenter.dialog.flow import spoken_prompts

    prompts = dict(spoken_prompts(flow))
    assert "Thank you for calling Example Telecom." in prompts  # the greeting, in the flow's voice
    assert prompts["Thank you for calling Example Telecom."] == flow.voice
    assert flow.trouble.say in prompts
    assert not any("{" in text for text in prompts)  # a sentence with a variable is made per call
    assert not any(text.startswith("I have a caller on the line") for text in prompts)  # the person's briefing


def test_a_reload_is_prepared_off_the_event_loop_before_calls_get_it(tmp_path):
    # the server renders a new version's line noise in `prepare` (up to a second): calls on the
    # loop must not stall meanwhile, and no call may get the version before it is ready
    import asyncio
    import threading
    import time
    from pathlib import Path

    from callcenter.dialog.library import FlowLibrary

    original = (Path(__file__).parent.parent / "flows" / "support.yaml").read_text()
    path = tmp_path / "flow.yaml"
    path.write_text(original)
    seen: dict = {}

    def prepare(flow):
        seen["thread"] = threading.current_thread()
        seen["current_then"] = library.current.version
        time.sleep(0.4)

    library = FlowLibrary(path, prepare=prepare)
    library.on_reload = lambda flow: seen.setdefault("reloaded", flow.version)

    async def run() -> float:
        watcher = asyncio.create_task(library.watch(interval=0.05))
        path.write_text(original.replace("version: 1", "version: 2"))
        worst, last = 0.0, time.monotonic()
        while library.current.version != 2 and time.monotonic() - last < 5:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        await asyncio.sleep(0.1)
        watcher.cancel()
        return worst

    worst_gap = asyncio.run(run())
    assert library.current.version == 2 and seen["reloaded"] == 2
    assert seen["thread"] is not threading.main_thread() and seen["current_then"] == 1
    assert worst_gap < 0.2, worst_gap


def test_a_rejected_edit_that_is_undone_is_no_longer_reported(tmp_path):
    """The flows screen said "edit rejected" after the file was put back as it was."""
    import os
    import time
    from pathlib import Path

    from callcenter.dialog.library import FlowLibrary

    original = (Path(__file__).parent.parent / "flows" / "support.yaml").read_text()
    path = tmp_path / "flow.yaml"
    path.write_text(original)
    library = FlowLibrary(path)
    path.write_text(original.replace("start:", "strat:"))
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)
    assert library.poll() is False and library.errors and library.current.version == 1
    path.write_text(original)
    os.utime(path, ns=(time.time_ns() + 2 * 10**9,) * 2)
    assert library.poll() is False
    assert library.errors == [] and library.current.version == 1
