"""The console's footer: whole keys only, as many as fit the width, by priority."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer

# the main screen's keys by how often a supervisor needs them: the footer shows those that fit its
# width, in this order of priority; every key works at any width, and `?` and the palette list all
FOOTER_PRIORITY = ("say", "take_over", "help", "release", "pause", "hangup", "transfer", "listen", "whisper",
                   "barge", "mark", "queues", "recordings", "flows", "ask_quit", "campaigns")
PALETTE_KEY_WIDTH = 12  # "▏^p palette"


class FitFooter(Footer):
    """Textual's footer, with only the keys that fit, so none is cut in half: at 80 columns the
    commonest call actions and help, from 120 transfer, listen, whisper and barge too
    (`FOOTER_PRIORITY`). On another screen (queues, campaigns...) that screen's own keys come first."""

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        from textual.widgets._footer import FooterKey

        shown = {}
        for _, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show and binding.action not in shown:
                shown[binding.action] = (binding, enabled, tooltip)
        room = (self.app.size.width or 80) - PALETTE_KEY_WIDTH
        # a screen's own keys first (Back, its actions), then the main screen's by priority
        own = [b.action for b in getattr(self.screen, "BINDINGS", []) if isinstance(b, Binding)]
        rank = {a: i for i, a in enumerate([*own, *(a for a in FOOTER_PRIORITY if a not in own)])}
        keep = set()
        for action in sorted(shown, key=lambda a: rank.get(a, len(rank))):
            binding = shown[action][0]
            need = len(self.app.get_key_display(binding)) + len(binding.description) + 3
            if need > room:
                break  # strictly by priority: never a rarer key in place of a commoner one
            keep.add(action)
            room -= need
        self.styles.grid_size_columns = len(keep)
        for action, (binding, enabled, tooltip) in shown.items():
            if action in keep:
                yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description,
                                binding.action, disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)
        if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE:
            found = self.screen.active_bindings.get(self.app.COMMAND_PALETTE_BINDING)
            if found is not None:
                _, binding, enabled, tooltip = found
                yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                                classes="-command-palette", disabled=not enabled, tooltip=binding.tooltip or
                                binding.description)

    def on_resize(self) -> None:
        self.refresh(recompose=True)
