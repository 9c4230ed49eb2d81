"""`flows check --hear`: names in a flow's fixed sentences are said by the flow's voice and heard
back by the agent's recognizer; a name that does not come back ("Sonnenschein") is reported at its
file:line:col, and names the voice says well are not."""

import asyncio

import pytest

from callcenter.dialog.flow import load_flow
from callcenter.hear_back import hear_back, names_in

pytestmark = pytest.mark.slow

FLOW = """\
name: dentist
start: welcome
nodes:
  welcome:
    type: say
    text: Welcome to Praxis Sonnenschein.
    next: main
  main:
    type: ask
    prompt: Thank you for calling Example Telecom. How can I help you?
    on_failure: bye
    intents:
      book:
        examples: [book an appointment]
        next: bye
  bye:
    type: hangup
    text: Goodbye.
"""


def test_names_are_capitalised_words_inside_a_sentence_or_foreign_letters():
    assert names_in("Thank you for calling Example Telecom. How can I help you?") == ["Example", "Telecom"]
    assert names_in("Goodbye. See you at Zahnarztpraxis Müller!") == ["Zahnarztpraxis", "Müller"]
    assert names_in("I can help with billing. Please hold.") == []


def test_a_name_the_voice_cannot_say_is_reported_where_it_is(tmp_path, stt, capsys):
    path = tmp_path / "dentist.yaml"
    path.write_text(FLOW)
    misheard = asyncio.run(hear_back(load_flow(path), stt))
    # the German names do not come back; "Example Telecom" does
    assert [m.name for m in misheard] == ["Praxis", "Sonnenschein"], misheard
    assert "sonnenschein" not in misheard[1].heard.lower()
    from callcenter.cli import main

    assert main(["flows", "check", "--hear", str(path)]) == 0  # a warning, not an error
    out = capsys.readouterr().out
    col = FLOW.splitlines()[5].index("Sonnenschein") + 1
    assert f"{path}:6:{col}: warning: the voice's 'Sonnenschein' was heard back as" in out, out
    assert out.strip().endswith("ok (2 warnings)")
